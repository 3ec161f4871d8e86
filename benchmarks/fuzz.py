"""Fuzzing as a benchmark: hostile inputs against the real server processes, a valid request after
every few hundred, crashes, unanswered inputs and memory (RSS) reported per socket.

Each socket gets --inputs inputs (default 10,000), drawn with a fixed seed from the families of
testing/fuzz.py (random frames, random msgpack, mutated valid messages of the socket, valid
messages of another socket); after every --check-every inputs (not counted as input) a Ping and a
real request of the socket (AssignmentRequest, MemoryQuery, a greedy GenerateRequest) must be
answered correctly.

Servers: `python -m pipeline empo2-replay-buffer` (ScienceWorld for its variation lists),
`python -m pipeline empo2-memory-service` (MiniLM; no policy server: queued reports wait for their
reflection) and `python -m pipeline empo2-policy-server` (a vLLM engine on the embedded model; the
inputs include weight chunks and weight files, which must be refused without touching the
weights), each started on its own in a temporary run directory and always stopped
(testing/fuzz_server.py; the inputs: testing/fuzz.py).

Run: `flock /tmp/empo2-heavy.lock .venv/bin/python -m benchmarks.fuzz [--inputs 10000] [--sockets replay_buffer memory_service]`
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.record import REPO, run_header, write_result
from testing.fuzz_server import SOCKETS, fuzz_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=10_000, help="hostile inputs per socket")
    parser.add_argument("--check-every", type=int, default=250, help="a valid request after this many inputs")
    parser.add_argument("--sockets", nargs="+", default=list(SOCKETS), choices=list(SOCKETS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=31560, help="the first socket's port (+10 per socket)")
    parser.add_argument("--metrics-base-port", type=int, default=31600)
    parser.add_argument("--out", default="benchmarks/results/fuzz.json")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="empo2-fuzz-") as tmp:
        for i, socket in enumerate(args.sockets):
            result = fuzz_server(
                socket,
                args.inputs,
                args.check_every,
                args.seed + i,
                args.port + 10 * i,
                args.metrics_base_port,
                Path(tmp),
                cwd=REPO,
            )
            results[socket] = result
            print(f"{socket}: {result}")
    invocation = [".venv/bin/python", "-m", "benchmarks.fuzz"]
    header = run_header(invocation, list(argv if argv is not None else sys.argv[1:]), load_average=os.getloadavg())
    write_result(args.out, {**header, "sockets": results})
    return 0 if all(not r["crashed"] and not r["valid_checks"].get("failed") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
