"""Assemble WeightChunk messages into one verified update staged as a safetensors file, and merge
a LoRA adapter onto the base model for adapter-only updates.

Plain logic, no sockets: the policy server feeds chunks in, gets a staged file path back when an
update is complete and its checksum matches. The frames are viewed as tensors (no copy) and
written once, into the staging file (protocol/weight_file.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common.lora import lora_merged
from common.process import alive
from protocol.messages import TensorMeta, WeightChunk
from protocol.weight_file import SAFETENSORS_DTYPES, bytes_tensor, weights_checksum, write_weight_file

# A refused LoRA update names this many of its offending tensors (enough to see the pattern).
NAMES_IN_ERROR = 5


class WeightUpdateError(ValueError):
    pass


STAGED = re.compile(r"empo2-weights-(\d+)-\d+\.safetensors")  # WeightAssembler's file: pid, then server index


def remove_dead_staged_files(staging_dir: str | Path) -> list[Path]:
    """Unlink the staged weight files of policy servers that are no longer alive: a server killed
    between staging an update and the engine's load leaves its file (a model's weights, in /dev/shm
    by default), and nobody else would remove it. A server calls this as it starts. The paths removed."""
    removed = []
    for path in Path(staging_dir).glob("empo2-weights-*-*.safetensors"):
        match = STAGED.fullmatch(path.name)
        if match is None or alive(int(match.group(1))):
            continue
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def frame_tensors(metas: list[TensorMeta], buffers) -> list[tuple[str, torch.Tensor]]:
    """Tensors viewing the received frames (no copy), each checked against its announced size."""
    tensors = []
    for meta, buf in zip(metas, buffers):
        dtype = getattr(torch, meta.dtype, None)
        if dtype not in SAFETENSORS_DTYPES:
            raise WeightUpdateError(f"tensor {meta.name}: dtype {meta.dtype} not supported")
        if len(buf) != math.prod(meta.shape) * dtype.itemsize:
            raise WeightUpdateError(f"tensor {meta.name}: {len(buf)} bytes for shape {meta.shape} of {meta.dtype}")
        tensors.append(
            (
                meta.name,
                bytes_tensor(buf).view(dtype).view(meta.shape) if len(buf) else torch.empty(meta.shape, dtype=dtype),
            )
        )
    return tensors


@dataclass
class WeightAssembler:
    """`max_bytes`: the most tensor bytes an unfinished update may hold (0: no bound). The policy
    server sets twice its model's weight files, so chunks that never complete (a client announcing
    100,000 of them) cannot take the host's memory."""

    staging_dir: Path
    server_id: str
    max_bytes: int = 0
    _version: int = -1
    _chunks: dict[int, WeightChunk] = field(default_factory=dict)
    _held_bytes: int = 0

    def add(self, chunk: WeightChunk) -> str | None:
        """Add a chunk; returns the staged file once the update is complete and verified."""
        if chunk.version != self._version:  # a new update replaces an unfinished older one
            self._version, self._chunks, self._held_bytes = chunk.version, {}, 0
        replaced = self._chunks.get(chunk.chunk_index)
        self._held_bytes += _data_bytes(chunk) - (_data_bytes(replaced) if replaced else 0)
        self._chunks[chunk.chunk_index] = chunk
        if self.max_bytes and self._held_bytes > self.max_bytes:
            held, self._version, self._chunks, self._held_bytes = self._held_bytes, -1, {}, 0
            raise WeightUpdateError(
                f"v{chunk.version}: {held} bytes of chunks held, over the limit of {self.max_bytes} "
                "(twice the model's weights); the update is dropped"
            )
        if len(self._chunks) < chunk.num_chunks:
            return None
        ordered = [self._chunks[i] for i in range(chunk.num_chunks)]
        self._chunks, self._held_bytes = {}, 0
        metas = [m for c in ordered for m in c.tensors]
        buffers = [memoryview(d) for c in ordered for d in c.data]
        if any((c.checksum, c.lora_scale) != (chunk.checksum, chunk.lora_scale) for c in ordered):
            raise WeightUpdateError(f"v{chunk.version}: chunks disagree on the checksum or the LoRA scale")
        actual = weights_checksum(buffers)
        if actual != chunk.checksum:
            raise WeightUpdateError(f"v{chunk.version}: checksum {actual} != announced {chunk.checksum}")
        path = Path(self.staging_dir) / f"empo2-weights-{self.server_id}.safetensors"
        write_weight_file(path, frame_tensors(metas, buffers))
        return str(path)


def _data_bytes(chunk: WeightChunk) -> int:
    return sum(len(memoryview(d)) for d in chunk.data)


def merged_lora_weights(
    base_dir: str, adapter: dict[str, torch.Tensor], scale: float
) -> list[tuple[str, torch.Tensor]]:
    """The base model's tensors (HF safetensors in `base_dir`, memory-mapped) with each adapted
    module's weight replaced by W0 + scale * B @ A; `adapter` holds `<module>.lora_A.weight` and
    `<module>.lora_B.weight` pairs. Checked in full before anything is returned, so a bad adapter
    is refused before the engine loads a single tensor."""
    from safetensors import safe_open

    modules = {name.removesuffix(".lora_A.weight") for name in adapter if name.endswith(".lora_A.weight")}
    expected = {f"{m}.lora_{x}.weight" for m in modules for x in "AB"}
    if set(adapter) != expected:
        raise WeightUpdateError(
            f"LoRA update: unpaired or unknown tensors {sorted(set(adapter) ^ expected)[:NAMES_IN_ERROR]}"
        )
    handles = [safe_open(str(f), framework="pt") for f in sorted(Path(base_dir).glob("*.safetensors"))]
    base_names = {name for h in handles for name in h.keys()}
    if missing := sorted(m for m in modules if f"{m}.weight" not in base_names):
        raise WeightUpdateError(f"LoRA update: no base weight for {missing[:NAMES_IN_ERROR]}")
    merged = []
    for handle in handles:
        for name in handle.keys():
            weight = handle.get_tensor(name)  # a view of the mapped file
            module = name.removesuffix(".weight")
            if module in modules:
                a, b = adapter[f"{module}.lora_A.weight"], adapter[f"{module}.lora_B.weight"]
                if (b.shape[0], a.shape[1]) != tuple(weight.shape) or a.shape[0] != b.shape[1]:
                    raise WeightUpdateError(
                        f"LoRA update: {module} B{list(b.shape)} A{list(a.shape)} do not fit W{list(weight.shape)}"
                    )
                weight = lora_merged(weight, a, b, scale)
            merged.append((name, weight))
    return merged
