"""Weight-sync benchmark: learner -> policy server wall time and effective GB/s per method, against
a plain memory copy of the same bytes measured in the same run.

    .venv/bin/python -m benchmarks.weight_sync [--repeats 3]

Starts one real policy server (vLLM, embedded model) on the e2e profile's ports through the
launcher, pushes the learner's full weights (fp32, 135M parameters, ~540 MB) with each method:
  zmq   tensor frames over a ZeroMQ socket, staged and reloaded by the server
  file  one safetensors file in /dev/shm (shared memory), verified and reloaded in place
and reports the median wall time of a push (send -> the new version is live), the engine reload
part of it, and bytes / wall time as a ratio to memcpy (torch clone of the same tensors).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import zmq

from common.config import load_config
from common.model_prep import resolve_model
from deploy.launch import Launcher, role_commands
from learner.policy_model import load_policy
from learner.weight_push import build_chunks, push_weight_file, push_weights, weight_tensors, write_weight_file
from protocol import Client
from protocol.transport import wait_until_ready

OVERRIDES = ["+profile=e2e", "run_dir=/tmp/empo2-bench-weight-sync"]


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
    model, _ = load_policy(resolve_model(cfg.model.name))
    tensors = weight_tensors(model)
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors)
    launcher = Launcher(cfg, OVERRIDES, roles=[r for r in role_commands(cfg) if r[0] == "policy_server0"])
    try:
        launcher.start()
        client = Client(zmq.Context.instance(), cfg.endpoints.policy_servers[0], timeout_s=300)
        wait_until_ready(client, "bench", timeout_s=900)
        version = 0
        times: dict[str, list[float]] = {"memcpy": [], "zmq": [], "file": []}
        for _ in range(args.repeats):
            times["memcpy"].append(memcpy_seconds(tensors))
            version += 1
            times["zmq"].append(push_weights([client], build_chunks(tensors, version, cfg.learner.weight_chunk_bytes), 300))
            version += 1
            t0 = time.perf_counter()
            path, checksum = write_weight_file(tensors, "/dev/shm", version)
            push_weight_file([client], path, checksum, version, 300)
            times["file"].append(time.perf_counter() - t0)
            os.remove(path)
        client.close()
    finally:
        launcher.stop()
    median = {k: float(np.median(v)) for k, v in times.items()}
    result = {
        "bytes": nbytes, "repeats": args.repeats, "median_seconds": median,
        "gb_per_s": {k: nbytes / v / 1e9 for k, v in median.items()},
        "ratio_to_memcpy": {k: median["memcpy"] / v for k, v in median.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'method':8}{'seconds':>10}{'GB/s':>8}{'vs memcpy':>11}   ({nbytes / 1e6:.0f} MB, median of {args.repeats})")
    for k in times:
        print(f"{k:8}{median[k]:10.3f}{result['gb_per_s'][k]:8.2f}{result['ratio_to_memcpy'][k]:11.3f}")


if __name__ == "__main__":
    main()
