"""A policy server's start-up and stop, alone on the machine, per vLLM executor (policy_server.executor):
time from the process's start to "engine ready" in its log, its processes, greedy tokens for three fixed
prompts (the executors must serve the same), generation throughput (8 concurrent requests of 64 tokens at
temperature 1), and the time from SIGTERM (to the server only, as empo2-run stops a role) to its exit.

    .venv/bin/python -m benchmarks.server_startup --executors mp uni --rounds 2

writes benchmarks/results/server_startup.{json,md}; the variants alternate round by round, so a change of
load on the machine falls on both.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import zmq

from benchmarks.record import REPO, run_header, write_result
from common.process import ROLE_ENV
from protocol import Client
from protocol.messages import GenerateRequest

RESULTS = REPO / "benchmarks" / "results"
ENDPOINT = "tcp://127.0.0.1:25990"
PROMPT = np.arange(100, 400, dtype=np.int32)


def one_start(executor: str, run_dir: Path) -> dict:
    log = run_dir / f"server_{executor}.log"
    argv = [sys.executable, "-m", "pipeline", "empo2-policy-server", f"endpoints.policy_servers=[{ENDPOINT}]",
            "metrics.base_port=29500", f"run_dir={run_dir}", f"policy_server.executor={executor}"]  # fmt: skip
    t0 = time.monotonic()
    with open(log, "w") as out:
        server = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, **ROLE_ENV}, start_new_session=True)  # fmt: skip
    try:
        ready = None
        while time.monotonic() - t0 < 600 and server.poll() is None:
            if "engine ready in" in log.read_text():
                ready = time.monotonic() - t0
                break
            time.sleep(0.2)
        if ready is None:
            raise RuntimeError(f"the server did not get ready: {log}")
        processes = len(subprocess.run(["pgrep", "-s", str(server.pid)], capture_output=True, text=True).stdout.split())
        ctx = zmq.Context()
        client = Client(ctx, ENDPOINT, 120)
        greedy = [
            client.call(
                GenerateRequest(request_id=f"g{i}", prompt_token_ids=PROMPT + i, max_tokens=24, temperature=0.0, seed=0)
            ).token_ids.tolist()
            for i in range(3)
        ]
        tokens: list[int] = []

        def generate(i: int) -> None:
            reply = Client(ctx, ENDPOINT, 300).call(
                GenerateRequest(
                    request_id=f"t{i}", prompt_token_ids=PROMPT[:200] + i, max_tokens=64, temperature=1.0, seed=i
                )
            )
            tokens.append(len(reply.token_ids))

        t1 = time.monotonic()
        threads = [threading.Thread(target=generate, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        throughput = sum(tokens) / (time.monotonic() - t1)
        t2 = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(120)
        stop = time.monotonic() - t2
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    text = log.read_text()
    return {
        "ready_s": round(ready, 1),
        "processes": processes,
        "tokens_per_s": round(throughput, 1),
        "stop_s": round(stop, 1),
        "exit": server.returncode,
        "clean_stop": not any(w in text for w in ("leaked", "force killing", "Traceback")),
        "greedy": greedy,
    }


def table(result: dict) -> str:
    lines = [
        "# A policy server's start-up and stop, per vLLM executor",
        "",
        f"{result['date']} · `{result['command']}` · {result['machine']['cpus']} cores, alone on the machine",
        "",
        f"| executor | ready s (median) | processes | tokens/s | stop s | clean stop | greedy tokens as {result['executors'][0]}'s |",
        "|---|---|---|---|---|---|---|",
    ]
    base = result["variants"][result["executors"][0]][0]["greedy"]
    for name in result["executors"]:
        runs = result["variants"][name]
        med = {k: statistics.median(r[k] for r in runs) for k in ("ready_s", "tokens_per_s", "stop_s")}
        lines.append(
            f"| {name} | {med['ready_s']:.1f} ({', '.join(str(r['ready_s']) for r in runs)}) | {runs[0]['processes']} | "
            f"{med['tokens_per_s']:.1f} | {med['stop_s']:.1f} | {all(r['clean_stop'] for r in runs)} | "
            f"{all(r['greedy'] == base for r in runs)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="server_startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--executors", nargs="+", default=["mp", "uni"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS / "server_startup"))
    args = parser.parse_args(argv)
    variants: dict[str, list[dict]] = {name: [] for name in args.executors}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name in args.executors:
                found = one_start(name, Path(tmp))
                variants[name].append(found)
                print(f"[server_startup] round {round_ + 1} {name}: {found['ready_s']} s ready, "
                      f"{found['tokens_per_s']} tok/s, stop {found['stop_s']} s", flush=True)  # fmt: skip
    result = {
        **run_header(["python", "-m", "benchmarks.server_startup"], argv if argv is not None else sys.argv[1:]),
        "executors": args.executors,
        "variants": variants,
    }
    write_result(f"{args.out}.json", result)
    Path(f"{args.out}.md").write_text(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
