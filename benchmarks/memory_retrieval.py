"""Memory-service benchmark: retrieval latency, per-query service cost, embedding and reflection throughput.

Measured in one run, so the figures can be read as ratios on a noisy shared machine:

1. retrieval: MemoryStore.retrieve p50/p99 and queries/s with 1k, 10k, 100k entries in ONE memory
   key (the "global" key, capacity = size). Entries have 384-d unit vectors: random "states", each
   stored REPEATS times (the same state met in several episodes, as in the real service), plus the
   real embeddings of the synthetic text pool. Half the queries are a stored state plus small noise
   (cosine ~0.96, so they hit), half are fresh random vectors (no hits); the mean hit count is
   reported. Stores are built through MemoryStore.add in batches into a temporary SQLite file;
   the build time and the time to reopen the file (the restart path) are reported.
   Dense case: a second store of the same size whose vectors all lie near one direction (pairwise
   cosine ~0.86, the median among the MiniLM embeddings of the synthetic observations), queried
   near that direction, so nearly every entry passes the threshold and the search sorts them all.
2. end to end: what the service pays per MemoryQuery, Embedder.embed([state]) + retrieve, p50/p99,
   at each size, as the service runs it (torch's default threads, one per core), then again with
   torch.set_num_threads(1): in one process, numpy's OpenBLAS threads (matrix-vector product of a
   search) and torch's OpenMP threads (the embedding) contend for the cores. Half the query texts
   are in the store, half are new.
3. embedding baseline: Embedder.embed texts/s at batch 1 and batch 64 on synthetic
   ScienceWorld-like observations (300-600 chars), and retrieval queries/s as a ratio to
   single-text embeddings/s (above 1: embedding dominates a query).
4. --reflections N > 0: starts a policy server (python -m pipeline empo2-policy-server on non-default
   ports), sends N reflection GenerateRequests one at a time as the service's worker does
   (prompts from memory_service.service.reflection_messages) and reports reflections/s and their
   ratio to the embedding throughput. The server's process group is always killed at the end.

Reproduce from the repository root (details and results in benchmarks/README.md):
    .venv/bin/python benchmarks/memory_retrieval.py [--sizes 1000 10000 100000] [--queries 200] [--e2e-queries 50] [--reflections 0]
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# Run as a script, this file's folder is sys.path[0] and this file would shadow the memory_service
# package: import the project from the repository root instead.
if Path(sys.path[0]).resolve() == HERE:
    sys.path[0] = str(REPO)

import argparse  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.record import run_header, write_result  # noqa: E402
from common.process import spawn_command, stop_group  # noqa: E402
from memory_service.embedder import Embedder  # noqa: E402
from memory_service.service import reflection_messages, tip_text  # noqa: E402
from memory_service.store import Entry, MemoryStore, memory_key  # noqa: E402
from pipeline.config import PipelineConfig, load_config  # noqa: E402

DIM = 384  # all-MiniLM-L6-v2
REPEATS = 10  # episodes that stored the same state (one entry each, different tips)
POOL = 64  # synthetic observations embedded for real: the batch-64 texts and stored states
QUERY_NOISE = 0.3  # norm of the noise added to a stored state to make a hitting query
DENSE_NOISE = 0.4  # noise norm around the dense store's direction: pairwise cosine 1 / (1 + 0.4^2)
ADD_BATCH = 10_000  # entries per MemoryStore.add call when building a store
KEY = memory_key("global", "", 0)
THREAD_ENV = ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT", "MKL_NUM_THREADS"]
POLICY_ENDPOINT = "tcp://127.0.0.1:22550"  # ports below Linux's ephemeral range (32768-60999)
POLICY_METRICS_PORT = 22600

ROOMS = [
    "kitchen",
    "bathroom",
    "workshop",
    "art studio",
    "greenhouse",
    "foundry",
    "living room",
    "bedroom",
    "hallway",
    "outside",
]
THINGS = [
    "a chair",
    "a counter",
    "a cupboard",
    "a freezer",
    "a fridge",
    "a glass jar",
    "a lighter",
    "an oven",
    "a painting",
    "a sink",
    "a stove",
    "a table",
    "a thermometer, currently reading a temperature of 10 degrees celsius",
    "a metal pot",
    "a wood cup",
    "a flower pot 2 (containing a peach tree in the adult stage, soil)",
    "a bee hive",
    "a battery",
    "a blue wire",
    "a red light bulb, which is off",
    "a switch, which is off",
    "a substance called water",
    "a bowl (containing a red apple, a banana, an orange, a potato)",
    "a drawer",
    "a book shelf",
    "an axe",
]
ACTIONS = [
    "look around",
    "open door to kitchen",
    "go to kitchen",
    "pick up thermometer",
    "focus on substance in metal pot",
    "move metal pot to stove",
    "activate stove",
    "use thermometer in inventory on substance in metal pot",
    "wait1",
]


# ---------------------------------------------------------------------------- synthetic data
def synthetic_observation(rng: np.random.Generator) -> str:
    """A ScienceWorld-like `look around` observation of 300-600 characters."""
    room, other = rng.choice(ROOMS, 2, replace=False)
    target = int(rng.integers(300, 601))
    text = f"This room is called the {room}. In it, you see:\n\tthe agent\n\ta substance called air\n"
    doors = f"You also see:\n\tA door to the {other} (that is {rng.choice(['open', 'closed'])})\n"
    for thing in rng.permutation(THINGS):
        line = f"\t{thing}\n"
        if len(text) + len(line) + len(doors) > target:
            break
        text += line
    return (text + doors)[:600]


def unit_rows(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def random_units(rng: np.random.Generator, n: int) -> np.ndarray:
    return unit_rows(rng.standard_normal((n, DIM)))


def near(rng: np.random.Generator, centres: np.ndarray, noise: float) -> np.ndarray:
    """Unit vectors at cosine ~1/sqrt(1 + noise^2) from their centre rows."""
    return unit_rows(centres + rng.standard_normal(centres.shape) * (noise / np.sqrt(DIM)))


# ---------------------------------------------------------------------------- timing helpers
@dataclass
class Latency:
    p50_ms: float
    p99_ms: float
    per_s: float  # calls per second over the whole timed loop


def timed(calls: list[Callable[[], object]]) -> tuple[Latency, list[object]]:
    """Run each call once; per-call latency percentiles, throughput and the results."""
    seconds, results = [], []
    start = time.perf_counter()
    for call in calls:
        t0 = time.perf_counter()
        results.append(call())
        seconds.append(time.perf_counter() - t0)
    total = time.perf_counter() - start
    ms = np.asarray(seconds) * 1e3
    return Latency(float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), len(calls) / total), results


# ---------------------------------------------------------------------------- embedding
@dataclass
class EmbeddingResult:
    batch1: Latency
    batch64_texts_per_s: float
    batch64_p50_ms: float


def bench_embedding(embedder: Embedder, rng: np.random.Generator, pool: list[str], queries: int) -> EmbeddingResult:
    embedder.embed(pool)  # warm-up: the first calls allocate and tune
    singles = [synthetic_observation(rng) for _ in range(queries)]
    batch1, _ = timed([lambda t=t: embedder.embed([t]) for t in singles])
    rounds = max(2, queries // POOL)
    batches = [[synthetic_observation(rng) for _ in range(POOL)] for _ in range(rounds)]
    batch64, _ = timed([lambda b=b: embedder.embed(b) for b in batches])
    return EmbeddingResult(batch1, batch64.per_s * POOL, batch64.p50_ms)


# ---------------------------------------------------------------------------- store
@dataclass
class SizeResult:
    size: int
    build_s: float  # MemoryStore.add of every entry, ADD_BATCH per call
    reopen_s: float  # MemoryStore(...) on the filled file: the restart path
    retrieve: Latency
    retrieve_mean_hits: float  # entries returned, at most top_k
    dense_retrieve: Latency
    dense_fraction_above_threshold: float  # of the stored entries, averaged over the queries
    end_to_end: Latency
    end_to_end_mean_hits: float
    end_to_end_torch_1_thread: Latency
    retrieve_per_s_over_embed1_per_s: float


def store_contents(
    rng: np.random.Generator, size: int, pool: list[str], pool_vectors: np.ndarray
) -> tuple[list[Entry], np.ndarray, np.ndarray]:
    """Entries and vectors for one store, and the random state vectors (for hitting queries)."""
    n_pool = min(len(pool), size // REPEATS // 2)  # at least half the states are random ones
    states = random_units(rng, size // REPEATS - n_pool)
    vectors = np.repeat(np.concatenate([pool_vectors[:n_pool], states]), REPEATS, axis=0)
    vectors = np.concatenate([vectors, random_units(rng, size - len(vectors))])
    entries = []
    for i in range(size):
        state_index = i // REPEATS
        state = pool[state_index] if state_index < n_pool else f"{pool[state_index % len(pool)]} #{state_index}"
        score = float(rng.integers(0, 101))
        reflection = f"Reflection number {i}: look around first, then focus on the task object."
        entries.append(Entry(tip_text(reflection, ACTIONS[i % len(ACTIONS)], score), score, state))
    return entries, vectors, states


def filled_store(
    db_path: Path, size: int, entries: list[Entry], vectors: np.ndarray
) -> tuple[MemoryStore, float, float]:
    """Fill a new SQLite file through MemoryStore.add, close it and reopen it (the restart path):
    the reopened store, the fill time and the reopen time."""
    store = MemoryStore(db_path, capacity=size)
    t0 = time.perf_counter()
    for i in range(0, size, ADD_BATCH):
        added = store.add(KEY, entries[i : i + ADD_BATCH], vectors[i : i + ADD_BATCH])
        assert added == len(entries[i : i + ADD_BATCH]), "entries were deduplicated: the benchmark data is wrong"
    build_s = time.perf_counter() - t0
    store.close()
    t0 = time.perf_counter()
    store = MemoryStore(db_path, capacity=size)
    return store, build_s, time.perf_counter() - t0


def retrieval_queries(rng: np.random.Generator, states: np.ndarray, n: int) -> list[np.ndarray]:
    """Half a stored state plus noise (hits), half fresh random vectors (no hits), shuffled."""
    n_hit = n // 2
    picked = states[rng.integers(0, len(states), n_hit)]
    return list(rng.permutation(np.concatenate([near(rng, picked, QUERY_NOISE), random_units(rng, n - n_hit)])))


def time_retrieval(store: MemoryStore, queries: list[np.ndarray], cfg: PipelineConfig) -> tuple[Latency, float]:
    """Latency of MemoryStore.retrieve and the mean number of entries it returned."""
    threshold, top_k = cfg.memory_service.similarity_threshold, cfg.memory_service.top_k
    store.retrieve(KEY, queries[0], threshold, top_k)  # warm-up
    latency, hits = timed([lambda q=q: store.retrieve(KEY, q, threshold, top_k) for q in queries])
    return latency, float(np.mean([len(h) for h in hits]))


def bench_dense(
    size: int, queries: int, rng: np.random.Generator, entries: list[Entry], cfg: PipelineConfig, tmp: Path
) -> tuple[Latency, float]:
    """Retrieval when nearly every entry passes the threshold, and the fraction that does."""
    direction = random_units(rng, 1)
    vectors = near(rng, np.repeat(direction, size, axis=0), DENSE_NOISE)
    query_vectors = list(near(rng, np.repeat(direction, queries, axis=0), DENSE_NOISE))
    store, _, _ = filled_store(tmp / f"dense_{size}.sqlite", size, entries, vectors)
    try:
        latency, _ = time_retrieval(store, query_vectors, cfg)
    finally:
        store.close()
    above = float(np.mean(vectors @ np.stack(query_vectors).T > cfg.memory_service.similarity_threshold))
    return latency, above


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def bench_size(
    size: int,
    queries: int,
    e2e_queries: int,
    rng: np.random.Generator,
    embedder: Embedder,
    cfg: PipelineConfig,
    pool: list[str],
    pool_vectors: np.ndarray,
    embed1_per_s: float,
    tmp: Path,
) -> SizeResult:
    threshold, top_k = cfg.memory_service.similarity_threshold, cfg.memory_service.top_k
    entries, vectors, states = store_contents(rng, size, pool, pool_vectors)
    store, build_s, reopen_s = filled_store(tmp / f"memory_{size}.sqlite", size, entries, vectors)
    try:
        retrieve, hits = time_retrieval(store, retrieval_queries(rng, states, queries), cfg)
        texts = [pool[i % len(pool)] if i % 2 == 0 else synthetic_observation(rng) for i in range(e2e_queries)]
        calls = [lambda t=t: store.retrieve(KEY, embedder.embed([t])[0], threshold, top_k) for t in texts]
        end_to_end, e2e_hits = timed(calls)
        with torch_threads(1):
            embedder.embed(texts[:1])  # warm-up with the new thread count
            end_to_end_1_thread, _ = timed(calls)
    finally:
        store.close()
    dense, above = bench_dense(size, queries, rng, entries, cfg, tmp)
    return SizeResult(
        size,
        build_s,
        reopen_s,
        retrieve,
        hits,
        dense,
        above,
        end_to_end,
        float(np.mean([len(h) for h in e2e_hits])),
        end_to_end_1_thread,
        retrieve.per_s / embed1_per_s,
    )


# ---------------------------------------------------------------------------- reflections
@dataclass
class ReflectionResult:
    count: int
    server_start_s: float  # process start until it answers Ping with ready
    total_s: float  # server start, the requests, server stop
    latency: Latency
    mean_prompt_tokens: float
    mean_tokens: float  # generated per reflection (cap: memory_service.reflection_max_tokens)
    reflections_per_s_over_embed64_texts_per_s: float


def start_policy_server(run_dir: Path) -> subprocess.Popen:
    """As every role is started (common/process.py): own session, so the group can be stopped."""
    overrides = [
        f"endpoints.policy_servers=[{POLICY_ENDPOINT}]",
        f"metrics.base_port={POLICY_METRICS_PORT}",
        f"run_dir={run_dir}",
    ]
    return spawn_command("empo2-policy-server", overrides, run_dir / "policy_server.log", cwd=REPO)


def server_log_tail(run_dir: Path) -> str:
    return (run_dir / "policy_server.log").read_text(errors="replace")[-3000:]


def reflection_prompts(cfg: PipelineConfig, rng: np.random.Generator, n: int) -> list[np.ndarray]:
    from transformers import AutoTokenizer

    from common.model_prep import resolve_model
    from protocol.messages import EpisodeReport

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.model.name, cfg.model.cache_dir or None))
    prompts = []
    for i in range(n):
        steps = int(rng.integers(4, 13))
        report = EpisodeReport(
            episode_id=f"bench-{i}",
            task="boil",
            variation=0,
            task_description="Your task is to boil water. First, focus on the substance.",
            score=float(rng.integers(0, 101)),
            observations=[synthetic_observation(rng) for _ in range(steps)],
            actions=[str(a) for a in rng.choice(ACTIONS, steps)],
        )
        messages = reflection_messages(report, cfg.memory_service)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompts.append(np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int32))
    return prompts


def bench_reflections(
    cfg: PipelineConfig, n: int, rng: np.random.Generator, embed64_per_s: float, tmp: Path
) -> ReflectionResult:
    import zmq

    from protocol import Client
    from protocol.messages import GenerateRequest
    from protocol.transport import wait_until_ready

    prompts = reflection_prompts(cfg, rng, n)
    mcfg = cfg.memory_service
    t0 = time.perf_counter()
    server = start_policy_server(tmp)
    client = Client(zmq.Context.instance(), POLICY_ENDPOINT, mcfg.reflection_timeout_s)

    def fail_if_exited(_remaining_s: float) -> None:
        if server.poll() is not None:
            raise RuntimeError(f"policy server exited ({server.returncode}):\n{server_log_tail(tmp)}")

    try:
        try:
            wait_until_ready(client, "benchmark", timeout_s=600, on_wait=fail_if_exited)
        except TimeoutError as exc:
            raise RuntimeError(f"policy server not ready after 600 s:\n{server_log_tail(tmp)}") from exc
        start_s = time.perf_counter() - t0
        requests = [
            GenerateRequest(
                request_id=f"reflect-{i}",
                prompt_token_ids=p,
                max_tokens=mcfg.reflection_max_tokens,
                temperature=mcfg.reflection_temperature,
                seed=i,
            )
            for i, p in enumerate(prompts)
        ]
        latency, responses = timed([lambda r=r: client.call(r) for r in requests])
    finally:
        client.close()
        stop_group(server, grace_s=20)  # the whole group: the vLLM workers too
    total_s = time.perf_counter() - t0
    mean_tokens = float(np.mean([len(r.token_ids) for r in responses]))
    return ReflectionResult(
        n,
        start_s,
        total_s,
        latency,
        float(np.mean([len(p) for p in prompts])),
        mean_tokens,
        latency.per_s / embed64_per_s,
    )


# ---------------------------------------------------------------------------- report
def print_table(embedding: EmbeddingResult, sizes: list[SizeResult], reflections: ReflectionResult | None) -> None:
    print(
        f"\nembedding (MiniLM, in-process): batch 1 {embedding.batch1.per_s:.1f} texts/s "
        f"(p50 {embedding.batch1.p50_ms:.1f} ms, p99 {embedding.batch1.p99_ms:.1f} ms); "
        f"batch 64 {embedding.batch64_texts_per_s:.1f} texts/s (p50 {embedding.batch64_p50_ms:.0f} ms per batch)"
    )
    print(f"\nretrieval (MemoryStore.retrieve, one key){'':<10}| dense: nearly every entry above the threshold")
    print(
        f"{'entries':>8} {'build s':>8} {'reopen s':>9} {'p50 ms':>8} {'p99 ms':>8} {'q/s':>7} {'hits':>5} "
        f"{'q/s / emb1/s':>13} | {'p50 ms':>8} {'p99 ms':>8} {'above':>6}"
    )
    for r in sizes:
        print(
            f"{r.size:>8} {r.build_s:>8.2f} {r.reopen_s:>9.2f} {r.retrieve.p50_ms:>8.3f} {r.retrieve.p99_ms:>8.3f} "
            f"{r.retrieve.per_s:>7.0f} {r.retrieve_mean_hits:>5.1f} {r.retrieve_per_s_over_embed1_per_s:>13.1f} | "
            f"{r.dense_retrieve.p50_ms:>8.3f} {r.dense_retrieve.p99_ms:>8.3f} {r.dense_fraction_above_threshold:>6.2f}"
        )
    print(
        "hits: entries returned per query (at most top_k); q/s / emb1/s: retrieval queries/s over batch-1 embeddings/s;"
        " above: fraction of entries past the threshold"
    )
    print(f"\nend to end (Embedder.embed([state]) + retrieve){'':<4}| same with torch.set_num_threads(1)")
    print(f"{'entries':>8} {'p50 ms':>8} {'p99 ms':>8} {'q/s':>6} {'hits':>5} | {'p50 ms':>8} {'p99 ms':>8} {'q/s':>6}")
    for r in sizes:
        e, one = r.end_to_end, r.end_to_end_torch_1_thread
        print(
            f"{r.size:>8} {e.p50_ms:>8.1f} {e.p99_ms:>8.1f} {e.per_s:>6.1f} {r.end_to_end_mean_hits:>5.1f} | "
            f"{one.p50_ms:>8.1f} {one.p99_ms:>8.1f} {one.per_s:>6.1f}"
        )
    if reflections is None:
        print("\nreflections: not measured (--reflections 0)")
    else:
        print(
            f"\nreflections: {reflections.latency.per_s:.3f}/s over {reflections.count} (p50 {reflections.latency.p50_ms:.0f} ms, "
            f"p99 {reflections.latency.p99_ms:.0f} ms, prompts {reflections.mean_prompt_tokens:.0f} tokens, "
            f"{reflections.mean_tokens:.0f} generated; server start {reflections.server_start_s:.0f} s, "
            f"whole part {reflections.total_s:.0f} s); ratio to batch-64 embedding texts/s "
            f"{reflections.reflections_per_s_over_embed64_texts_per_s:.5f}"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1000, 10000, 100000], help="entries in the one memory key (>= 100)"
    )
    parser.add_argument(
        "--queries", type=int, default=200, help="timed retrievals per size (and single-text embeddings)"
    )
    parser.add_argument(
        "--e2e-queries", type=int, default=50, help="timed embed + retrieve queries per size and thread setting"
    )
    parser.add_argument(
        "--reflections", type=int, default=0, help="reflection requests to a policy server it starts (0: skip)"
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "memory_retrieval.json")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.sizes) < 100 or args.queries < 2 or args.e2e_queries < 2:
        parser.error("sizes must be >= 100, queries and e2e-queries >= 2")
    return args


def measure(
    args: argparse.Namespace, cfg: PipelineConfig
) -> tuple[EmbeddingResult, list[SizeResult], ReflectionResult | None]:
    """The embedder's rates, the store at each size, and the reflections (None with --reflections 0)."""
    rng = np.random.default_rng(args.seed)
    embedder = Embedder(cfg.memory_service.embedder)
    pool = [synthetic_observation(rng) for _ in range(POOL)]
    embedding = bench_embedding(embedder, rng, pool, args.queries)
    pool_vectors = embedder.embed(pool)
    with tempfile.TemporaryDirectory(prefix="empo2-bench-") as tmp:
        sizes = [
            bench_size(
                size,
                args.queries,
                args.e2e_queries,
                rng,
                embedder,
                cfg,
                pool,
                pool_vectors,
                embedding.batch1.per_s,
                Path(tmp),
            )
            for size in args.sizes
        ]
        reflections = (
            bench_reflections(cfg, args.reflections, rng, embedding.batch64_texts_per_s, Path(tmp))
            if args.reflections > 0
            else None
        )
    return embedding, sizes, reflections


def report(
    args: argparse.Namespace,
    argv: list[str] | None,
    cfg: PipelineConfig,
    measured: tuple[EmbeddingResult, list[SizeResult], ReflectionResult | None],
    wall0: float,
    load_at_start: tuple[float, float, float],
) -> None:
    """The table printed, and the result written to --out."""
    embedding, sizes, reflections = measured
    wall_s = time.perf_counter() - wall0
    print_table(embedding, sizes, reflections)
    print(f"wall time {wall_s:.0f} s; load average at start {load_at_start[0]:.2f}")
    result = {
        **run_header(
            [".venv/bin/python", "benchmarks/memory_retrieval.py"],
            argv if argv is not None else sys.argv[1:],
            load_average_at_start=load_at_start,
        ),
        "settings": {
            "dim": DIM,
            "repeats": REPEATS,
            "pool": POOL,
            "query_noise": QUERY_NOISE,
            "add_batch": ADD_BATCH,
            "threshold": cfg.memory_service.similarity_threshold,
            "top_k": cfg.memory_service.top_k,
            "dense_noise": DENSE_NOISE,
            "queries": args.queries,
            "e2e_queries": args.e2e_queries,
            "torch_threads": torch.get_num_threads(),
            "thread_env": {k: os.environ.get(k) for k in THREAD_ENV},
            "seed": args.seed,
        },
        "embedding": asdict(embedding),
        "sizes": [asdict(s) for s in sizes],
        "reflections": asdict(reflections) if reflections is not None else None,
        "wall_s": wall_s,
    }
    write_result(args.out, result)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    wall0 = time.perf_counter()
    load_at_start = os.getloadavg()
    cfg = load_config([])
    report(args, argv, cfg, measure(args, cfg), wall0, load_at_start)


if __name__ == "__main__":
    main()
