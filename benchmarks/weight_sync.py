"""Weight-sync benchmark: learner -> policy server wall time and effective GB/s per method, against
a plain memory copy of the same bytes measured in the same run.

    .venv/bin/python -m benchmarks.weight_sync [--repeats 5] [--warmup 2]

Starts one real policy server (vLLM, embedded model) on the e2e profile's ports through the
launcher and pushes the learner's full weights (fp32, 135M parameters, ~540 MB) with each CPU
method of weight_sync.method, through the learner's own WeightPusher:
  zmq         tensor frames over a ZeroMQ socket, staged and loaded by the server
  shm         one safetensors file in /dev/shm, rewritten in place at every push, verified and
              loaded from the mapping
  checkpoint  an HF checkpoint written to the run directory, verified and loaded (the push
              includes writing the checkpoint, as the learner does at every step with this method)
For each it reports the median wall time of a push (first byte written -> the new version is
live), split into the engine part (vLLM's in-place load, measured by the server) and the
transport part (everything else: writing, sending, checksums), each as a ratio to memcpy.
Two memcpy baselines of the same tensors, in the same run: `clone` (a copy into new memory, as a
receiver of new weights makes) and `copy_` into buffers allocated and touched beforehand (memory
bandwidth alone, the stricter one: on this VM first-touch page faults can cost more than the copy).
The first `--warmup` rounds are not counted: training pushes every step, and what matters is the
steady state (the first shm push also allocates the file's pages). nccl needs GPUs and is not
measured here.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import zmq

from benchmarks.record import command_line, write_result
from common.model_prep import resolve_model
from deploy.launch import Launcher
from learner.checkpoint import save_checkpoint
from learner.policy_model import load_policy
from learner.weight_push import PushTiming, WeightPusher, weight_tensors
from pipeline.config import load_config
from pipeline.roles import run_roles
from protocol import Client
from protocol.transport import wait_until_ready

RUN_DIR = "/tmp/empo2-bench-weight-sync"
OVERRIDES = ["profile=e2e", f"run_dir={RUN_DIR}"]
METHODS = ("zmq", "shm", "checkpoint")


def memcpy_seconds(tensors: list[tuple[str, torch.Tensor]]) -> dict[str, float]:
    t0 = time.perf_counter()
    copies = [t.clone() for _, t in tensors]
    clone_s = time.perf_counter() - t0
    for copy in copies:
        copy.zero_()  # touched: only the copy is left to time
    t0 = time.perf_counter()
    for copy, (_, t) in zip(copies, tensors):
        copy.copy_(t)
    return {"clone": clone_s, "copy_": time.perf_counter() - t0}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="rounds not counted")
    parser.add_argument("--out", default="benchmarks/results/weight_sync.json")
    return parser.parse_args()


def push_rounds(
    args: argparse.Namespace,
    model,
    tokenizer,
    tensors: list[tuple[str, torch.Tensor]],
    pushers: dict[str, WeightPusher],
) -> tuple[list[dict[str, float]], dict[str, list[PushTiming]]]:
    """--warmup + --repeats rounds, each a memcpy of the weights, then a push by every method (a
    new version each); the memcpy seconds and the push timings of the counted rounds."""
    optimizer = torch.optim.AdamW(model.parameters())  # the checkpoint carries it, as the learner's does
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)

    def push_checkpoint(version: int) -> PushTiming:
        t0 = time.perf_counter()
        path = save_checkpoint(
            Path(RUN_DIR) / "checkpoints",
            version,
            model,
            tokenizer,
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
            1,
        )
        timing = pushers["checkpoint"].push_checkpoint(path, version)
        return PushTiming(time.perf_counter() - t0, timing.engine_seconds)

    version = 0
    memcpy, timings = [], {m: [] for m in METHODS}
    for round_ in range(args.warmup + args.repeats):
        counted = round_ >= args.warmup
        copies = memcpy_seconds(tensors)
        memcpy += [copies] if counted else []
        for method in METHODS:
            version += 1
            timing = push_checkpoint(version) if method == "checkpoint" else pushers[method].push(tensors, version)
            timings[method] += [timing] if counted else []
    return memcpy, timings


def measure(
    args: argparse.Namespace, cfg, model, tokenizer, tensors: list[tuple[str, torch.Tensor]]
) -> tuple[list[dict[str, float]], dict[str, list[PushTiming]]]:
    """A policy server of its own, a pusher per method to it, the rounds (push_rounds); the server
    stopped and the pushers closed on any exit."""
    launcher = Launcher(cfg, OVERRIDES, roles=[r for r in run_roles(cfg) if r[0] == "policy_server0"])
    pushers: dict[str, WeightPusher] = {}
    try:
        launcher.start()
        client = Client(zmq.Context.instance(), cfg.endpoints.policy_servers[0], timeout_s=300)
        wait_until_ready(client, "bench", timeout_s=900)
        for m in METHODS:
            mcfg = load_config([*OVERRIDES, f"weight_sync.method={m}"])
            pushers[m] = WeightPusher(
                mcfg.weight_sync,
                [client],
                mcfg.learner.push_timeout_s,
                mcfg.policy_server.tensor_parallel_size,
                mcfg.learner.push_attempts,
            )
        measured = push_rounds(args, model, tokenizer, tensors, pushers)
        client.close()
    finally:
        for pusher in pushers.values():
            pusher.close()
        launcher.stop()
    return measured


def report(
    args: argparse.Namespace, nbytes: int, memcpy: list[dict[str, float]], timings: dict[str, list[PushTiming]]
) -> None:
    """Medians per method against the memcpy baselines, printed as a table and written to --out."""
    base = {kind: float(np.median([m[kind] for m in memcpy])) for kind in ("clone", "copy_")}
    result = {
        "bytes": nbytes,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "memcpy_seconds": base,
        "gb_per_s": {f"memcpy_{k}": nbytes / v / 1e9 for k, v in base.items()},
        "methods": {},
    }
    print(
        f"{'method':13}{'seconds':>9}{'GB/s':>7}{'vs clone':>10}{'vs copy_':>10}{'engine s':>10}{'transport s':>13}"
        f"{'transport vs clone':>20}{'vs copy_':>10}   ({nbytes / 1e6:.0f} MB, median of {args.repeats})"
    )
    for kind, seconds in base.items():
        print(
            f"{'memcpy ' + kind:13}{seconds:9.3f}{nbytes / seconds / 1e9:7.2f}{base['clone'] / seconds:10.3f}{base['copy_'] / seconds:10.3f}"
        )
    for method, runs in timings.items():
        total = float(np.median([t.seconds for t in runs]))
        engine = float(np.median([t.engine_seconds for t in runs]))
        transport = float(np.median([t.transport_seconds for t in runs]))
        result["methods"][method] = {
            "seconds": total,
            "engine_seconds": engine,
            "transport_seconds": transport,
            "gb_per_s": nbytes / total / 1e9,
            "ratio_to_memcpy_clone": base["clone"] / total,
            "ratio_to_memcpy_copy": base["copy_"] / total,
            "transport_ratio_to_memcpy_clone": base["clone"] / transport,
            "transport_ratio_to_memcpy_copy": base["copy_"] / transport,
        }
        print(
            f"{method:13}{total:9.3f}{nbytes / total / 1e9:7.2f}{base['clone'] / total:10.3f}{base['copy_'] / total:10.3f}{engine:10.3f}"
            f"{transport:13.3f}{base['clone'] / transport:20.3f}{base['copy_'] / transport:10.3f}"
        )
    result["command"] = command_line(
        ["python", "-m", "benchmarks.weight_sync"], [f"--{k} {v}" for k, v in vars(args).items()]
    )
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    write_result(args.out, result, indent=1)


def main() -> None:
    args = parse_args()
    cfg = load_config(OVERRIDES)
    shutil.rmtree(Path(RUN_DIR) / "checkpoints", ignore_errors=True)  # retention keeps the newest: no older runs' steps
    model, tokenizer = load_policy(resolve_model(cfg.model.name), "cpu")
    tensors = weight_tensors(model)
    memcpy, timings = measure(args, cfg, model, tokenizer, tensors)
    report(args, sum(t.numel() * t.element_size() for _, t in tensors), memcpy, timings)


if __name__ == "__main__":
    main()
