"""Memory at scale: N actors querying a real memory service at full rate, once per
memory_service.query_batch setting (1: one embedding per query, as before; 64: the queries waiting
together embedded in one call), the ratio to the first setting in the same run.

    .venv/bin/python -m benchmarks.memory_load [--actors 64] [--seconds 20] [--batches 1 64]

Each actor is a thread with its own DEALER sending MemoryQuery after MemoryQuery (`--states`
distinct ScienceWorld-like states in turn, so nothing is answered from a repeat) to a memory
service started afresh per setting (`python -m pipeline empo2-memory-service`, ports away from the
tests'), whose memory holds `--entries` entries under the queried key (stored through its own
EpisodeReport path would need a policy server: they are written into its SQLite store before it
starts, as a restarted service finds them). Per setting, over `--seconds` after the first answer:
queries/s, p50/p99 latency, the mean embedding batch (its metrics), its RSS, and the CPU milliseconds per
query of the service and of the client threads (this process: where the two cores went). Every process started
is stopped at the end, also on an error. Results: benchmarks/README.md#memory-load.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import zmq

from benchmarks.load import Rss, pct, wait_ready
from benchmarks.record import run_header, write_result
from common.process import spawn_command, stop_group
from deploy.monitor import scrape
from memory_service.store import Entry, MemoryStore, memory_key
from protocol import Client, RemoteError, RequestTimeout
from protocol.messages import MemoryQuery, MemoryResult

MEMORY, NO_POLICY = "tcp://127.0.0.1:23670", "tcp://127.0.0.1:23650"
METRICS_BASE = 33500  # memory service 33601
TASK, VARIATION = "find-living-thing", 0
ROOMS = ["kitchen", "hallway", "greenhouse", "bathroom", "workshop", "art studio", "bedroom", "living room"]
OBJECTS = ["a fridge", "a sink", "a counter", "a bee", "a flower pot", "a table", "a chair", "an oven", "a cup"]


def state(i: int) -> str:
    """A look text like ScienceWorld's, distinct per i."""
    room = ROOMS[i % len(ROOMS)]
    seen = ", ".join(OBJECTS[(i + k) % len(OBJECTS)] for k in range(3 + i % 4))
    return f"This room is called the {room}. In it, you see: {seen}, and item {i}. You also see: a door to the hallway."


def fill(db: Path, entries: int, dim: int = 384) -> None:
    """`entries` entries under the queried key, random unit vectors (the search's cost, not its hits)."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((entries, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = MemoryStore(db, capacity=max(entries, 1))
    key = memory_key("task_variation", TASK, VARIATION)
    store.add(key, [Entry(f"tip {i}", float(i % 100), state(i)) for i in range(entries)], vectors)
    store.close()


def overrides(run_dir: Path, batch: int) -> list[str]:
    return [
        f"run_dir={run_dir}",
        f"endpoints.memory_service={MEMORY}",
        f"endpoints.policy_servers=[{NO_POLICY}]",
        f"metrics.base_port={METRICS_BASE}",
        f"memory_service.query_batch={batch}",
    ]


def query_loop(offset: int, states: int, stop: threading.Event, latencies: list, counted: list, lock) -> None:
    client, i = Client(zmq.Context.instance(), MEMORY, 60.0), offset
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                result = client.call(MemoryQuery(task=TASK, variation=VARIATION, state=state(i % states)))
            except (RequestTimeout, RemoteError):
                continue
            assert isinstance(result, MemoryResult)
            i += 1
            with lock:
                latencies.append(time.perf_counter() - t0)
                counted[0] += not stop.is_set()
    finally:
        client.close()


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU seconds of a process and its children so far."""
    times = proc.cpu_times()
    children = sum(c.cpu_times().user + c.cpu_times().system for c in proc.children(recursive=True))
    return times.user + times.system + children


def run_setting(batch: int, args, root: Path) -> dict:
    run_dir = root / f"batch{batch}"
    run_dir.mkdir()
    fill(run_dir / "memory.sqlite", args.entries)
    proc = spawn_command("empo2-memory-service", overrides(run_dir, batch), root / f"memory{batch}.log")
    try:
        wait_ready(MEMORY)
        rss = Rss(proc.pid)
        stop, lock, latencies, counted = threading.Event(), threading.Lock(), [], [0]
        threads = [
            threading.Thread(
                target=query_loop, args=(k * 1000, args.states, stop, latencies, counted, lock), daemon=True
            )
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
        cpu0 = (cpu_seconds(service), cpu_seconds(clients))
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            time.sleep(1.0)
            rss.sample()
        stop.set()
        wall = time.monotonic() - t0
        cpu = (cpu_seconds(service) - cpu0[0], cpu_seconds(clients) - cpu0[1])
        for t in threads:
            t.join(30)
        metrics = scrape("127.0.0.1", METRICS_BASE + 101)
        sizes = metrics.get("empo2_memory_service_embedding_batch_size_sum", 0.0)
        calls = metrics.get("empo2_memory_service_embedding_batch_size_count", 0.0)
        return {
            "query_batch": batch,
            "queries_per_s": round(counted[0] / wall, 1),
            "latency_ms": {"p50": pct(latencies, 50), "p99": pct(latencies, 99)},
            "mean_embedding_batch": round(sizes / calls, 2) if calls else None,
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
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64], help="memory_service.query_batch values")
    parser.add_argument("--states", type=int, default=2000, help="distinct states queried in turn")
    parser.add_argument("--entries", type=int, default=1000, help="entries under the queried key")
    parser.add_argument("--out", default="benchmarks/results/memory_load.json")
    args = parser.parse_args(argv)
    header = run_header([".venv/bin/python", "-m", "benchmarks.memory_load"], sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="empo2-memory-load-") as tmp:
        settings = []
        for batch in args.batches:
            settings.append(run_setting(batch, args, Path(tmp)))
            print(settings[-1], flush=True)
    base = settings[0]["queries_per_s"]
    for s in settings:
        s["queries_per_s_vs_first"] = round(s["queries_per_s"] / max(base, 1e-9), 2)
    result = {**header, "actors": args.actors, "seconds": args.seconds, "entries": args.entries, "settings": settings}
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
