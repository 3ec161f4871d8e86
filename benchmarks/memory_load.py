"""Memory at scale: N actors querying a real memory service at full rate, once per setting of
memory_service.query_batch, embedding_cache, embedding_max_tokens and embedding_dtype, the ratio to
the first setting (one float32 embedding of the whole state per query, no cache: what the service did
before issue 26) in the same run.

    .venv/bin/python -m benchmarks.memory_load [--actors 64] [--seconds 20] [--settings 1:0 64:0 64:4096 64:4096:128:auto]

A setting is QUERY_BATCH:EMBEDDING_CACHE[:EMBEDDING_MAX_TOKENS:EMBEDDING_DTYPE]; without the last two,
the embedder's own limit (0) and float32.

Each actor is a thread with its own DEALER sending MemoryQuery after MemoryQuery to a memory service
started afresh per setting (`python -m pipeline empo2-memory-service`, ports away from the tests'),
whose memory holds `--entries` entries under the queried key (stored through its own EpisodeReport
path would need a policy server: they are written into its SQLite store before it starts, as a
restarted service finds them). The states are real ScienceWorld observations (the committed
episodes of benchmarks/results/episodes/, ~150 tokens), each new one made distinct by a line of its
own; with probability `--repeat` a query asks again for a state its group (8 actors, one variation,
as the buffer's groups) asked for recently, else for a new one. The default 0.42 is the rate measured
in those episodes (17 of 40 and 45 of 109 observations repeat an earlier one of the same run).
`--repeat 0`: every query a new state, the cache's worst case. Per setting, over `--seconds` after
the first answer: queries/s, p50/p99 latency, the mean queries per embedding call and the cache's
hit rate (its metrics), its RSS, and the CPU milliseconds per query of the service and of the client
threads (this process: where the two cores went), and how far its answers are from the first
setting's (agreement: the retrieval decisions on pairs of the real observations). The query stream is seeded: every setting sees the
same one. Every process started is stopped at the end, also on an error. Results:
benchmarks/README.md#memory-load.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psutil
import zmq

from benchmarks.load import Rss, pct, wait_ready
from benchmarks.record import run_header, write_result
from common.metrics import MEMORY_SERVICE_EMBEDDING_BATCH_SIZE, MEMORY_SERVICE_EMBEDDING_CACHE
from common.process import spawn_command, stop_group
from deploy.monitor import scrape
from memory_service.config import EMBEDDED_EMBEDDER, MemoryServiceConfig
from memory_service.embedder import Embedder, uses_bf16
from memory_service.store import Entry, MemoryStore, memory_key
from protocol import Client, RemoteError, RequestTimeout
from protocol.messages import MemoryQuery, MemoryResult
from replay_buffer.buffer import BufferLog

MEMORY, NO_POLICY = "tcp://127.0.0.1:23670", "tcp://127.0.0.1:23650"
METRICS_BASE = 4000  # memory service 4101 (below 32768: out of the ephemeral ports)
TASK, VARIATION = "find-living-thing", 0
EPISODES = Path(__file__).parent / "results" / "episodes"
GROUP = 8  # actors sharing a variation (replay_buffer.group_size of the CPU profile)
RECENT = 256  # a repeat asks for one of its group's last RECENT states


def observations() -> list[str]:
    """The distinct observations of the committed real episodes, in order."""
    texts = [o for log in sorted(EPISODES.glob("*.log")) for t in BufferLog.read(log)[0] for o in t.observations]
    return list(dict.fromkeys(texts))


def state(i: int, real: list[str]) -> str:
    """A real observation with a line of its own: distinct per i, a real one's length."""
    return f"{real[i % len(real)]}\nYou also notice item {i}."


class StateStream:
    """A group's queries: a recent state again with probability `repeat`, else a new one. Seeded
    per group, so every setting of a run asks for the same states in the same order per group."""

    def __init__(self, group: int, repeat: float, real: list[str]):
        self.rng, self.repeat, self.real = random.Random(group), repeat, real
        self.next_new, self.recent = group * 1_000_000, []
        self.lock = threading.Lock()

    def next(self) -> str:
        with self.lock:
            if self.recent and self.rng.random() < self.repeat:
                return self.rng.choice(self.recent)
            text = state(self.next_new, self.real)
            self.next_new += 1
            self.recent = [*self.recent[-(RECENT - 1) :], text]
            return text


def fill(db: Path, entries: int, real: list[str], dim: int = 384) -> None:
    """`entries` entries under the queried key, random unit vectors (the search's cost, not its hits)."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((entries, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = MemoryStore(db, capacity=max(entries, 1))
    key = memory_key("task_variation", TASK, VARIATION)
    store.add(key, [Entry(f"tip {i}", float(i % 100), state(i, real)) for i in range(entries)], vectors)
    store.close()


@dataclass(frozen=True)
class Setting:
    query_batch: int
    embedding_cache: int
    embedding_max_tokens: int = 0
    embedding_dtype: str = "float32"

    @classmethod
    def parse(cls, text: str) -> Setting:
        parts = text.split(":")
        if len(parts) not in (2, 4):
            raise SystemExit(f"--settings {text}: QUERY_BATCH:EMBEDDING_CACHE[:EMBEDDING_MAX_TOKENS:EMBEDDING_DTYPE]")
        return cls(*(int(x) for x in parts[:3]), *parts[3:])


@functools.cache
def embed_as(max_tokens: int, bf16: bool, texts: tuple[str, ...]) -> np.ndarray:
    """The vectors the service would give `texts` with this forward (one lone call, no cache):
    computed once per forward, however many settings share it."""
    return Embedder(EMBEDDED_EMBEDDER, max_tokens=max_tokens, bf16=bf16).embed(list(texts))


def forward_of(setting: Setting) -> tuple[int, bool]:
    return setting.embedding_max_tokens, uses_bf16(setting.embedding_dtype)


def agreement(vectors: np.ndarray, first: np.ndarray, threshold: float) -> dict:
    """How far a setting's answers are from the first setting's, on the real observations: a stored
    state is retrieved for a query when their cosine exceeds memory_service.similarity_threshold, so
    the fraction of (query, stored) pairs decided alike, and the lowest cosine of a vector to its
    first-setting one."""
    pairs = np.triu_indices(len(first), 1)
    alike = ((vectors @ vectors.T)[pairs] > threshold) == ((first @ first.T)[pairs] > threshold)
    return {
        "pairs_decided_as_first": round(float(alike.mean()), 4),
        "min_cosine_to_first": round(float(np.min(np.sum(vectors * first, axis=1))), 5),
    }


def overrides(run_dir: Path, setting: Setting) -> list[str]:
    return [
        f"run_dir={run_dir}",
        f"endpoints.memory_service={MEMORY}",
        f"endpoints.policy_servers=[{NO_POLICY}]",
        f"metrics.base_port={METRICS_BASE}",
        *(f"memory_service.{k}={v}" for k, v in asdict(setting).items()),
    ]


def query_loop(stream: StateStream, stop: threading.Event, latencies: list, counted: list, lock) -> None:
    client = Client(zmq.Context.instance(), MEMORY, 60.0)
    try:
        while not stop.is_set():
            query = MemoryQuery(task=TASK, variation=VARIATION, state=stream.next())
            t0 = time.perf_counter()
            try:
                result = client.call(query)
            except (RequestTimeout, RemoteError):
                continue
            assert isinstance(result, MemoryResult)
            with lock:
                latencies.append(time.perf_counter() - t0)
                counted[0] += not stop.is_set()
    finally:
        client.close()


def cpu_seconds(proc: psutil.Process, children: bool = True) -> float:
    """User + system CPU seconds of a process (and its children) so far."""
    times = proc.cpu_times()
    below = proc.children(recursive=True) if children else []
    return times.user + times.system + sum(c.cpu_times().user + c.cpu_times().system for c in below)


def run_setting(setting: Setting, args, root: Path, real: list[str]) -> dict:
    run_dir = root / "_".join(str(v) for v in asdict(setting).values())
    run_dir.mkdir()
    fill(run_dir / "memory.sqlite", args.entries, real)
    proc = spawn_command("empo2-memory-service", overrides(run_dir, setting), run_dir / "memory.log")
    try:
        wait_ready(MEMORY)
        rss = Rss(proc.pid)
        stop, lock, latencies, counted = threading.Event(), threading.Lock(), [], [0]
        streams = [StateStream(g, args.repeat, real) for g in range(-(-args.actors // GROUP))]
        threads = [
            threading.Thread(target=query_loop, args=(streams[k // GROUP], stop, latencies, counted, lock), daemon=True)
            for k in range(args.actors)
        ]
        for t in threads:
            t.start()
        while not latencies:  # the window starts at the first answer
            time.sleep(0.05)
        with lock:
            latencies.clear()
            counted[0] = 0
        service, clients = psutil.Process(proc.pid), psutil.Process()
        cpu0 = (cpu_seconds(service), cpu_seconds(clients, children=False))  # the service is this one's child
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            time.sleep(1.0)
            rss.sample()
        stop.set()
        wall = time.monotonic() - t0
        cpu = (cpu_seconds(service) - cpu0[0], cpu_seconds(clients, children=False) - cpu0[1])
        for t in threads:
            t.join(30)
        metrics = scrape("127.0.0.1", METRICS_BASE + 101)
        sizes = metrics.get(f"{MEMORY_SERVICE_EMBEDDING_BATCH_SIZE}_sum", 0.0)
        calls = metrics.get(f"{MEMORY_SERVICE_EMBEDDING_BATCH_SIZE}_count", 0.0)
        hits = metrics.get(f'{MEMORY_SERVICE_EMBEDDING_CACHE}{{result="hit"}}', 0.0)
        misses = metrics.get(f'{MEMORY_SERVICE_EMBEDDING_CACHE}{{result="miss"}}', 0.0)
        return {
            **asdict(setting),
            "queries_per_s": round(counted[0] / wall, 1),
            "latency_ms": {"p50": pct(latencies, 50), "p99": pct(latencies, 99)},
            "mean_embedding_batch": round(sizes / calls, 2) if calls else None,
            "cache_hit_rate": round(hits / (hits + misses), 3) if hits + misses else None,
            # where the two cores went: the service's CPU time and the 64 client threads' (this process), per query
            "cpu_ms_per_query": {
                "service": round(1000 * cpu[0] / max(counted[0], 1), 2),
                "clients": round(1000 * cpu[1] / max(counted[0], 1), 2),
            },
            "rss": rss.report(),
        }
    finally:
        stop_group(proc, grace_s=20)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0, help="per setting")
    parser.add_argument(
        "--settings",
        nargs="+",
        default=["1:0", "64:0", "64:4096", "64:4096:128:auto"],
        help="QUERY_BATCH:EMBEDDING_CACHE[:EMBEDDING_MAX_TOKENS:EMBEDDING_DTYPE]; the first is the baseline",
    )
    parser.add_argument("--repeat", type=float, default=0.42, help="probability a query repeats a recent state")
    parser.add_argument("--entries", type=int, default=1000, help="entries under the queried key")
    parser.add_argument("--out", default="benchmarks/results/memory_load.json")
    args = parser.parse_args(argv)
    header = run_header([".venv/bin/python", "-m", "benchmarks.memory_load"], sys.argv[1:] if argv is None else argv)
    real = observations()
    parsed = [Setting.parse(text) for text in args.settings]
    first = embed_as(*forward_of(parsed[0]), tuple(real))
    threshold = MemoryServiceConfig().similarity_threshold
    with tempfile.TemporaryDirectory(prefix="empo2-memory-load-") as tmp:
        settings = []
        for setting in parsed:
            settings.append(run_setting(setting, args, Path(tmp), real))
            settings[-1]["answers"] = agreement(embed_as(*forward_of(setting), tuple(real)), first, threshold)
            print(settings[-1], flush=True)
    base = settings[0]["queries_per_s"]
    for s in settings:
        s["queries_per_s_vs_first"] = round(s["queries_per_s"] / max(base, 1e-9), 2)
    result = {
        **header,
        "actors": args.actors,
        "seconds": args.seconds,
        "entries": args.entries,
        "repeat": args.repeat,
        "settings": settings,
    }
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
