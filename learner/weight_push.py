"""Push the learner's weights to every policy server, by one of two methods (learner.weight_sync):

- "zmq": tensors travel as uint8 views of their memory (zero-copy on CPU) in WeightChunk
  messages of about `chunk_bytes`, with a blake2b checksum over all bytes; works across hosts.
- "file": the learner writes one safetensors file (in /dev/shm: shared memory, written once for
  every server on the host; or on a shared filesystem) and sends its path and checksum in a
  WeightFile message; each server verifies and loads it in place.
Each server acknowledges; the last ack says the new version is live there.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from protocol import Client
from protocol.messages import TensorMeta, WeightChunk, WeightFile, WeightUpdateAck, file_checksum, weights_checksum

log = logging.getLogger(__name__)


def weight_tensors(model) -> list[tuple[str, torch.Tensor]]:
    """HF-named tensors a server needs; a tied lm_head is skipped (the server ties it itself)."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    return [(name, t.detach()) for name, t in model.state_dict().items() if not (tied and name == "lm_head.weight")]


def build_chunks(tensors: list[tuple[str, torch.Tensor]], version: int, chunk_bytes: int) -> list[WeightChunk]:
    views = []
    for name, t in tensors:
        cpu = t.to("cpu").contiguous()
        views.append((TensorMeta(name, str(cpu.dtype).removeprefix("torch."), list(cpu.shape)), cpu.view(-1).view(torch.uint8).numpy()))
    checksum = weights_checksum(memoryview(v) for _, v in views)
    groups, current, size = [], [], 0
    for meta, view in views:
        if current and size + view.nbytes > chunk_bytes:
            groups.append(current)
            current, size = [], 0
        current.append((meta, view))
        size += view.nbytes
    groups.append(current)
    return [
        WeightChunk(version=version, chunk_index=i, num_chunks=len(groups), tensors=[m for m, _ in g], data=[v for _, v in g], checksum=checksum)
        for i, g in enumerate(groups)
    ]


def push_weights(clients: list[Client], chunks: list[WeightChunk], timeout_s: float) -> float:
    """Send every chunk to every server; returns the wall time until all report the version live."""
    t0 = time.perf_counter()
    for client in clients:
        for chunk in chunks:
            ack = client.call(chunk, timeout_s=timeout_s)
            if not isinstance(ack, WeightUpdateAck):
                raise RuntimeError(f"{client.endpoint} answered {ack.KIND} to a weight chunk")
        if not (ack.applied and ack.version == chunks[-1].version):
            raise RuntimeError(f"{client.endpoint} did not apply version {chunks[-1].version}: {ack}")
        log.info("%s now serves v%d (engine reload %.2fs)", client.endpoint, ack.version, ack.apply_seconds)
    return time.perf_counter() - t0


def write_weight_file(tensors: list[tuple[str, torch.Tensor]], directory: str, version: int) -> tuple[str, str]:
    """Write the tensors as one safetensors file, atomically; returns (path, checksum)."""
    from safetensors.torch import save_file

    path = Path(directory) / f"empo2-weights-{os.getpid()}-v{version}.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file({name: t.to("cpu").contiguous() for name, t in tensors}, str(tmp))
    os.replace(tmp, path)
    return str(path), file_checksum(str(path))


def push_weight_file(clients: list[Client], path: str, checksum: str, version: int, timeout_s: float) -> float:
    """Announce a written weight file to every server; returns the wall time until all run it."""
    t0 = time.perf_counter()
    for client in clients:
        ack = client.call(WeightFile(version=version, path=path, checksum=checksum), timeout_s=timeout_s)
        if not (isinstance(ack, WeightUpdateAck) and ack.applied and ack.version == version):
            raise RuntimeError(f"{client.endpoint} did not apply version {version}: {ack}")
        log.info("%s now serves v%d from %s (engine reload %.2fs)", client.endpoint, version, path, ack.apply_seconds)
    return time.perf_counter() - t0
