"""Load: N synthetic actors at full rate against a real replay buffer and a real memory service,
once per log durability level (replay_buffer.durability), the ratio to `flush` in the same run.

    .venv/bin/python -m benchmarks.load [--actors 64] [--seconds 20] [--levels flush fsync group]

Each actor is a thread with its own sockets, like an env actor without an env or an LLM: it asks
the buffer for an assignment (a real lease), answers it with a valid synthetic Trajectory
(`--turns` turns of `--prompt-tokens` prompt and `--response-tokens` response tokens) and waits
for the Ack; a second thread of the same actor sends MemoryQuery after MemoryQuery to the memory
service. A learner thread takes batches (BatchRequest, every part) and confirms them
(BatchConfirm), so the buffer never stops on backpressure. Per level, for `--seconds` after the
first Ack: accepted messages/s (trajectory Acks, memory results, assignments, batches), p50/p99
latency of the trajectory Ack and of the memory result, RSS of both servers (at the start, peak,
end) and, once the buffer is stopped, an audit of its log: every acknowledged episode id in it
exactly once. The memory service is started once (its embedder loads in ~20 s); the buffer is
started afresh per level on a new log (it reads ScienceWorld's variation list at start-up). Every
process started is killed (process groups) at the end, also on an error. Results:
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import secrets
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import zmq

from benchmarks.record import run_header, write_result
from common.config import MetricsConfig
from common.metrics import REPLAY_BUFFER_LOG_FSYNC_SECONDS
from common.process import spawn_command, stop_group
from deploy.monitor import scrape
from pipeline.roles import LEARNER_TOKEN_ENV
from protocol import Client, RemoteError, RequestTimeout
from protocol.messages import (
    Ack,
    Assignment,
    AssignmentRequest,
    Batch,
    BatchConfirm,
    BatchRequest,
    MemoryQuery,
    MemoryResult,
    Trajectory,
    Wait,
)
from protocol.transport import wait_until_ready
from replay_buffer.buffer import BufferLog
from testing.factories import random_turns
from testing.factories import trajectory as synthetic_trajectory

BUFFER, MEMORY, NO_POLICY = "tcp://127.0.0.1:23560", "tcp://127.0.0.1:23570", "tcp://127.0.0.1:23550"
METRICS_BASE = 7000  # buffer 7100, memory service 7101 (below 32768: out of the ephemeral ports)
CLIENT_TIMEOUT_S = 30.0
LEARNER_TOKEN = secrets.token_urlsafe(24)  # the buffer serves batches only to it (issue 26): the learner thread's
STATES = [f"This room is called the kitchen. In it, you see: a fridge, a counter and item {i}." for i in range(50)]


def overrides(run_dir: Path, durability: str) -> list[str]:
    return [
        f"run_dir={run_dir}",
        f"endpoints.replay_buffer={BUFFER}",
        f"endpoints.memory_service={MEMORY}",
        f"endpoints.policy_servers=[{NO_POLICY}]",
        f"metrics.base_port={METRICS_BASE}",
        f"replay_buffer.durability={durability}",
        "replay_buffer.group_size=8",
        "replay_buffer.max_open_groups=16",  # every actor can hold a lease
        "replay_buffer.max_ready_groups=64",
        "replay_buffer.batch_poll_s=0.05",
        "learner.groups_per_step=2",
    ]


def trajectory(a: Assignment, actor: str, turns: int, prompt: int, response: int, rng) -> Trajectory:
    return synthetic_trajectory(
        random_turns(rng, [prompt] * turns, [response] * turns),
        episode_id=f"{actor}-{a.group_id[:8]}-{a.slot}-{rng.integers(1 << 62)}",
        group_id=a.group_id,
        slot=a.slot,
        actor_id=actor,
        task=a.task,
        variation=a.variation,
        mode=a.mode,
        score=float(rng.integers(0, 100)),
        done=False,
        observations=[STATES[i % len(STATES)] for i in range(turns)],
    )


@dataclass
class Tally:
    """What the actors saw, merged under a lock."""

    acked: list[str] = field(default_factory=list)  # episode ids acknowledged by the buffer
    ack_s: list[float] = field(default_factory=list)
    query_s: list[float] = field(default_factory=list)
    assignments: int = 0
    waits: int = 0
    batches: int = 0
    # replies that arrived before the stop (the rates; requests still in flight drain after it)
    in_window: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def actor_loop(name: str, args, stop: threading.Event, tally: Tally) -> None:
    ctx, rng = zmq.Context.instance(), np.random.default_rng(abs(hash(name)) % (1 << 32))
    buffer = Client(ctx, BUFFER, CLIENT_TIMEOUT_S)
    try:
        while not stop.is_set():
            try:
                reply = buffer.call(AssignmentRequest(actor_id=name))
                if isinstance(reply, Wait):
                    with tally.lock:
                        tally.waits += 1
                    time.sleep(min(reply.retry_after_s, 0.1))
                    continue
                with tally.lock:
                    tally.assignments += 1
                    tally.in_window["assignment"] += not stop.is_set()
                traj = trajectory(reply, name, args.turns, args.prompt_tokens, args.response_tokens, rng)
                t0 = time.perf_counter()
                ack = buffer.call(traj)
                elapsed = time.perf_counter() - t0
            except (RequestTimeout, RemoteError) as exc:
                with tally.lock:
                    tally.errors[type(exc).__name__] += 1
                continue
            assert isinstance(ack, Ack)
            with tally.lock:
                tally.acked.append(traj.episode_id)
                tally.ack_s.append(elapsed)
                tally.in_window["trajectory"] += not stop.is_set()
    finally:
        buffer.close()


def query_loop(name: str, stop: threading.Event, tally: Tally) -> None:
    memory, i = Client(zmq.Context.instance(), MEMORY, CLIENT_TIMEOUT_S), 0
    try:
        while not stop.is_set():
            i += 1
            t0 = time.perf_counter()
            try:
                result = memory.call(MemoryQuery(task="find-living-thing", variation=0, state=STATES[i % len(STATES)]))
            except (RequestTimeout, RemoteError) as exc:
                with tally.lock:
                    tally.errors[f"memory {type(exc).__name__}"] += 1
                continue
            assert isinstance(result, MemoryResult)
            with tally.lock:
                tally.query_s.append(time.perf_counter() - t0)
                tally.in_window["memory_result"] += not stop.is_set()
    finally:
        memory.close()


def learner_loop(stop: threading.Event, tally: Tally) -> None:
    buffer = Client(zmq.Context.instance(), BUFFER, CLIENT_TIMEOUT_S)
    request = BatchRequest(
        learner_version=0, num_groups=2, max_staleness=1000, max_bytes=buffer.max_bytes, token=LEARNER_TOKEN
    )
    try:
        while not stop.is_set():
            reply = buffer.call(request)
            if isinstance(reply, Wait):
                time.sleep(reply.retry_after_s)
                continue
            assert isinstance(reply, Batch)
            for part in range(1, reply.num_parts):
                buffer.call(dataclasses.replace(request, batch_id=reply.batch_id, part=part))
            buffer.call(BatchConfirm(batch_id=reply.batch_id))
            with tally.lock:
                tally.batches += 1
                tally.in_window["batch"] += not stop.is_set()
    finally:
        buffer.close()


class Rss:
    """RSS of a process: at the start, the peak of samples every second, at the end (MB)."""

    def __init__(self, pid: int):
        self.proc = psutil.Process(pid)
        self.start = self.peak = self.now()

    def now(self) -> float:
        return self.proc.memory_info().rss / 1e6

    def sample(self) -> None:
        self.peak = max(self.peak, self.now())

    def report(self) -> dict:
        end = self.now()
        return {"start_mb": round(self.start, 1), "peak_mb": round(max(self.peak, end), 1), "end_mb": round(end, 1)}


def audit(log_path: Path, acked: list[str]) -> dict:
    """Every acknowledged episode id in the buffer's log exactly once."""
    trajectories, _, found = BufferLog.read(log_path)
    logged = Counter(t.episode_id for t in trajectories)
    return {
        "acknowledged": len(acked),
        "acknowledged_distinct": len(set(acked)),
        "in_log": sum(logged.values()),
        "missing": sum(1 for e in set(acked) if logged[e] == 0),
        "more_than_once": sum(1 for n in logged.values() if n > 1),
        "corrupt_records": found.faults,
        "ok": all(logged[e] == 1 for e in acked) and not any(n > 1 for n in logged.values()),
    }


def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else float("nan")


def wait_ready(endpoint: str) -> None:
    client = Client(zmq.Context.instance(), endpoint, 5)
    try:
        wait_until_ready(client, "bench", timeout_s=300)
    finally:
        client.close()


def run_level(level: str, args, root: Path, memory_rss: Rss) -> dict:
    run_dir = root / level
    run_dir.mkdir()
    proc = spawn_command(
        "empo2-replay-buffer",
        overrides(run_dir, level),
        root / f"buffer-{level}.log",
        env_extra={LEARNER_TOKEN_ENV: LEARNER_TOKEN},  # as empo2-run hands it over
    )
    try:
        wait_ready(BUFFER)
        buffer_rss, memory_rss.start = Rss(proc.pid), memory_rss.now()
        memory_rss.peak = memory_rss.start
        tally, stop = Tally(), threading.Event()
        threads = [threading.Thread(target=learner_loop, args=(stop, tally), daemon=True)]
        for i in range(args.actors):
            threads.append(threading.Thread(target=actor_loop, args=(f"a{i}", args, stop, tally), daemon=True))
            threads.append(threading.Thread(target=query_loop, args=(f"a{i}", stop, tally), daemon=True))
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            time.sleep(1.0)
            buffer_rss.sample()
            memory_rss.sample()
        stop.set()
        wall = time.perf_counter() - t0
        for t in threads:
            t.join(CLIENT_TIMEOUT_S + 5)
        metrics = scrape("127.0.0.1", MetricsConfig(base_port=METRICS_BASE).port("replay_buffer"))
        rss = buffer_rss.report()
    finally:
        stop_group(proc, grace_s=20)  # SIGTERM: the buffer closes (syncs) its log
    window = tally.in_window
    return {
        "durability": level,
        "seconds": round(wall, 2),
        "trajectories_acked": len(tally.acked),
        "trajectories_per_s": round(window["trajectory"] / wall, 1),
        "memory_queries_per_s": round(window["memory_result"] / wall, 1),
        "accepted_messages_per_s": round(sum(window.values()) / wall, 1),
        "batches_confirmed": tally.batches,
        "assignment_waits": tally.waits,
        "errors": dict(tally.errors),
        "ack_latency_ms": {"p50": pct(tally.ack_s, 50), "p99": pct(tally.ack_s, 99)},
        "memory_latency_ms": {"p50": pct(tally.query_s, 50), "p99": pct(tally.query_s, 99)},
        "group_commits": metrics.get(f"{REPLAY_BUFFER_LOG_FSYNC_SECONDS}_count", 0.0),
        "buffer_rss": rss,
        "memory_rss": memory_rss.report(),
        "audit": audit(run_dir / "buffer.log", tally.acked),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--actors", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0, help="per durability level")
    parser.add_argument("--levels", nargs="+", default=["flush", "fsync", "group"])
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--response-tokens", type=int, default=16)
    parser.add_argument("--out", default="benchmarks/results/load.json")
    args = parser.parse_args(argv)
    header = run_header([".venv/bin/python", "-m", "benchmarks.load"], sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="empo2-load-") as tmp:
        root = Path(tmp)
        (root / "memory").mkdir()
        memory = spawn_command("empo2-memory-service", overrides(root / "memory", "flush"), root / "memory.log")
        try:
            wait_ready(MEMORY)
            memory_rss = Rss(memory.pid)
            levels = []
            for level in args.levels:
                levels.append(run_level(level, args, root, memory_rss))
                print(levels[-1], flush=True)
        finally:
            stop_group(memory, grace_s=20)
    base = next((r for r in levels if r["durability"] == "flush"), levels[0])
    for r in levels:
        r["trajectories_per_s_vs_flush"] = round(r["trajectories_per_s"] / max(base["trajectories_per_s"], 1e-9), 3)
    result = {
        **header,
        "actors": args.actors,
        "trajectory": {
            "turns": args.turns,
            "prompt_tokens": args.prompt_tokens,
            "response_tokens": args.response_tokens,
        },
        "levels": levels,
    }
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
