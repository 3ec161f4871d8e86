"""Weight-sync benchmark: learner -> policy server wall time and effective GB/s per method, against
a plain memory copy of the same bytes measured in the same run.

    .venv/bin/python -m benchmarks.weight_sync [--repeats 3]

Starts one real policy server (vLLM, embedded model) on the e2e profile's ports through the
launcher and pushes the learner's full weights (fp32, 135M parameters, ~540 MB) with each CPU
method of learner.weight_sync, through the learner's own WeightPusher:
  zmq         tensor frames over a ZeroMQ socket, staged and loaded by the server
  shm         one safetensors file in /dev/shm, verified and loaded from the mapping
  checkpoint  an HF checkpoint written to the run directory, verified and loaded (the push
              includes writing the checkpoint, as the learner does at every step with this method)
For each it reports the median wall time of a push (first byte written -> the new version is
live), split into the engine part (vLLM's in-place load, measured by the server) and the
transport part (everything else: writing, sending, checksums), each as a ratio to memcpy (torch
clone of the same tensors). nccl needs GPUs and is not measured here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import zmq

from common.config import load_config
from common.model_prep import resolve_model
from deploy.launch import Launcher, role_commands
from learner.checkpoint import save_checkpoint
from learner.policy_model import load_policy
from learner.weight_push import PushTiming, WeightPusher, weight_tensors
from protocol import Client
from protocol.transport import wait_until_ready

RUN_DIR = "/tmp/empo2-bench-weight-sync"
OVERRIDES = ["+profile=e2e", f"run_dir={RUN_DIR}"]
METHODS = ("zmq", "shm", "checkpoint")


def memcpy_seconds(tensors: list[tuple[str, torch.Tensor]]) -> float:
    t0 = time.perf_counter()
    copies = [t.clone() for _, t in tensors]
    elapsed = time.perf_counter() - t0
    del copies
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/weight_sync.json")
    args = parser.parse_args()

    cfg = load_config(OVERRIDES)
    shutil.rmtree(Path(RUN_DIR) / "checkpoints", ignore_errors=True)  # retention keeps the newest: no older runs' steps
    model, tokenizer = load_policy(resolve_model(cfg.model.name))
    tensors = weight_tensors(model)
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    launcher = Launcher(cfg, OVERRIDES, roles=[r for r in role_commands(cfg) if r[0] == "policy_server0"])
    try:
        launcher.start()
        client = Client(zmq.Context.instance(), cfg.endpoints.policy_servers[0], timeout_s=300)
        wait_until_ready(client, "bench", timeout_s=900)
        pushers = {m: WeightPusher(load_config([*OVERRIDES, f"learner.weight_sync={m}"]).learner, [client]) for m in METHODS}
        optimizer = torch.optim.AdamW(model.parameters())  # the checkpoint carries it, as the learner's does
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)

        def push_checkpoint(version: int) -> PushTiming:
            t0 = time.perf_counter()
            path = save_checkpoint(Path(RUN_DIR) / "checkpoints", version, model, tokenizer, {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, 1)
            timing = pushers["checkpoint"].push_checkpoint(path, version)
            return PushTiming(time.perf_counter() - t0, timing.engine_seconds)

        version = 0
        memcpy, timings = [], {m: [] for m in METHODS}
        for _ in range(args.repeats):
            memcpy.append(memcpy_seconds(tensors))
            for method in METHODS:
                version += 1
                timings[method].append(push_checkpoint(version) if method == "checkpoint" else pushers[method].push(tensors, version))
        client.close()
    finally:
        launcher.stop()
    base = float(np.median(memcpy))
    result = {"bytes": nbytes, "repeats": args.repeats, "memcpy_seconds": base, "gb_per_s": {"memcpy": nbytes / base / 1e9}, "methods": {}}
    print(f"{'method':11}{'seconds':>9}{'GB/s':>7}{'vs memcpy':>11}{'engine s':>10}{'transport s':>13}{'transport vs memcpy':>21}"
          f"   ({nbytes / 1e6:.0f} MB, median of {args.repeats})")
    print(f"{'memcpy':11}{base:9.3f}{nbytes / base / 1e9:7.2f}{1:11.3f}")
    for method, runs in timings.items():
        total = float(np.median([t.seconds for t in runs]))
        engine = float(np.median([t.engine_seconds for t in runs]))
        transport = float(np.median([t.transport_seconds for t in runs]))
        result["methods"][method] = {
            "seconds": total, "engine_seconds": engine, "transport_seconds": transport, "gb_per_s": nbytes / total / 1e9,
            "ratio_to_memcpy": base / total, "transport_ratio_to_memcpy": base / transport,
        }
        print(f"{method:11}{total:9.3f}{nbytes / total / 1e9:7.2f}{base / total:11.3f}{engine:10.3f}{transport:13.3f}{base / transport:21.3f}")
    result["command"] = "python -m benchmarks.weight_sync " + " ".join(f"--{k} {v}" for k, v in vars(args).items())
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
