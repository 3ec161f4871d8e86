"""Colocation: a learner step and vLLM generation sharing the cores, by thread setting, in one run.

The policy server (the real role, vLLM on CPU) is kept busy by `--streams` client threads sending
the recorded episodes' turn prompts (GenerateRequest, 32 tokens at temperature 1, as env actors
do), while benchmarks.learner_throughput takes `--packing` steps on the recorded batch in a process
of its own. Per setting: the learner's seconds per step and the tokens the server generated per
second while the learner process ran; and, in the same run, the learner with nothing beside it and
the server with no learner. Settings (--settings):

  spin         torch's threads (one per core), vLLM's OpenMP threads unpinned (cpu_omp_threads_bind=nobind),
               OMP_WAIT_POLICY unset: libgomp's threads spin at a barrier before they sleep
  passive      the same with OMP_WAIT_POLICY=PASSIVE (the roles' default, common/process.py): a
               waiting thread sleeps instead of spinning on a core the other process needs
  partitioned  passive, the learner one torch thread, vLLM one OpenMP thread pinned to core 0

    flock /tmp/empo2-heavy.lock .venv/bin/python -m benchmarks.colocation --episodes runs/<run>/buffer.log
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import zmq

from benchmarks.record import REPO, run_header, write_result
from common.process import role_env, spawn_command, stop_group
from protocol import Client
from protocol.messages import GenerateRequest
from protocol.transport import wait_until_ready
from replay_buffer.buffer import BufferLog

SERVER = "tcp://127.0.0.1:46550"
SPIN = {"OMP_WAIT_POLICY": None}  # libgomp's own default
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}
SETTINGS = {
    # (the environment of both processes, learner.torch_threads, policy_server.cpu_omp_threads_bind)
    "spin": (SPIN, 0, "nobind"),
    "passive": (PASSIVE, 0, "nobind"),
    "partitioned": (PASSIVE, 1, "0"),
}


class Generation:
    """`streams` threads sending the prompts round and round until stopped; completion times and tokens."""

    def __init__(self, prompts: list[np.ndarray], streams: int):
        self.prompts, self.done = prompts, []  # (monotonic time, tokens) per completion
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(streams)]
        for t in self.threads:
            t.start()

    def _loop(self, stream: int) -> None:
        client = Client(zmq.Context.instance(), SERVER, 300)
        try:
            for n in range(stream, 10**9, len(self.threads)):
                if self.stop.is_set():
                    return
                prompt = self.prompts[n % len(self.prompts)]
                request = GenerateRequest(f"c{stream}-{n}", prompt, 32, 1.0, n, stop=["\n"])
                reply = client.call(request)
                self.done.append((time.monotonic(), len(reply.token_ids)))
        finally:
            client.close()

    def tokens_per_s(self, start: float, end: float) -> float:
        return sum(n for t, n in self.done if start <= t <= end) / (end - start)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def learner(args, env: dict, threads: int, out: Path) -> tuple[float, float, float]:
    """(step seconds, process start, process end): learner_throughput's median over its repeats."""
    command = [
        sys.executable, "-m", "benchmarks.learner_throughput", "--episodes", str(args.episodes),
        "--groups", str(args.groups), "--packings", args.packing, "--micro-batch-tokens", str(args.micro_batch_tokens),
        "--warmup", "1", "--repeats", str(args.repeats), "--threads", str(threads), "--out", str(out),
    ]  # fmt: skip
    start = time.monotonic()
    subprocess.run(command, cwd=REPO, env=role_env(env), check=True, stdout=subprocess.DEVNULL)
    end = time.monotonic()
    return json.loads(out.read_text())["packing"][args.packing]["step_seconds"], start, end


def serve(tmp: Path, env: dict, bind: str) -> subprocess.Popen:
    overrides = [
        f"run_dir={tmp}",
        f"endpoints.policy_servers=[{SERVER}]",
        "metrics.base_port=46600",
        f"policy_server.cpu_omp_threads_bind={bind}",
    ]
    proc = spawn_command("empo2-policy-server", overrides, tmp / f"policy_server-{bind}.log", env_extra=env)
    client = Client(zmq.Context.instance(), SERVER, 5)
    try:
        wait_until_ready(client, "colocation", timeout_s=600)
    finally:
        client.close()
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=Path, required=True, help="a replay-buffer log (runs/<run>/buffer.log)")
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--packing", default="group")
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--streams", type=int, default=2, help="concurrent generation requests (env actors)")
    parser.add_argument("--settings", default="spin,passive,partitioned")
    parser.add_argument("--alone-s", type=float, default=60, help="seconds of generation with no learner")
    parser.add_argument("--out", default="benchmarks/results/colocation.json")
    args = parser.parse_args()
    prompts = [t.turn_prompt(i) for t in BufferLog.read(args.episodes)[0] for i in range(t.num_turns)]

    result = run_header([".venv/bin/python", "-m", "benchmarks.colocation"], sys.argv[1:])
    result |= {"packing": args.packing, "micro_batch_tokens": args.micro_batch_tokens, "streams": args.streams}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in args.settings.split(","):
            env, threads, bind = SETTINGS[name]
            alone, _, _ = learner(args, env, threads, root / f"{name}-alone.json")
            server = serve(root, env, bind)
            try:
                gen = Generation(prompts, args.streams)
                time.sleep(10)  # past the first requests' prefills
                t0 = time.monotonic()
                time.sleep(args.alone_s)
                generated_alone = gen.tokens_per_s(t0, time.monotonic())
                step_s, start, end = learner(args, env, threads, root / f"{name}.json")
                generated = gen.tokens_per_s(start, end)
                gen.close()
            finally:
                stop_group(server, 10)
            result[name] = {
                "learner_alone_step_seconds": alone,
                "learner_step_seconds": step_s,
                "learner_slowdown": step_s / alone,
                "generated_tokens_per_s": generated,
                "generated_tokens_per_s_alone": generated_alone,
                "generation_slowdown": generated_alone / max(generated, 1e-9),
            }
            print(name, result[name], flush=True)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
