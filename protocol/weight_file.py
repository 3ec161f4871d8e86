"""The weight file of a file-based update (WeightFile; the zmq path stages its chunks the same way):
the safetensors layout (8-byte little-endian header length, JSON header, raw tensor bytes), written
and read through memory mappings so that no tensor is copied more than once on either side.

- Tensors are laid out in the order given. The learner gives its model's own order, which puts
  the q/k/v and gate/up projections next to each other, so a server whose engine fuses them reads
  each fused weight as one view of the mapping (`concat_rows`), without a concatenation.
- The writer rewrites an existing file in place: a file in /dev/shm keeps its pages between
  updates, and rewriting 0.5 GB of warm pages costs a memcpy where a new file would first fault
  in every page (on this VM that alone took longer than the copy).
- Writer and readers synchronise with flock: the writer holds LOCK_EX while it writes, a server
  holds LOCK_SH (`shared_lock`) while it verifies and loads, so a rewrite never tears a load.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import mmap
import os
import struct
import warnings
from pathlib import Path

import torch
import xxhash

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_TORCH_DTYPES = {v: k for k, v in SAFETENSORS_DTYPES.items()}


class WeightFileError(ValueError):
    pass


def weights_checksum(buffers) -> str:
    """WeightChunk/WeightFile checksum: XXH3-128 over all bytes in order (sender and receiver).

    A non-cryptographic hash on purpose: it guards against torn, truncated or mismatched updates
    (not an attacker, who could rewrite the announced checksum too), and at ~18 GB/s it costs
    0.03 s for the 538 MB model where blake2b took 0.5 s on each side of every push.
    """
    h = xxhash.xxh3_128()
    for buf in buffers:
        h.update(buf)
    return h.hexdigest()


def bytes_tensor(buffer) -> torch.Tensor:
    """A uint8 tensor viewing `buffer` with no copy; read-only buffers (received frames, read-only
    mappings) are fine, the tensors made from them are only ever copied from."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that the buffer is not writable
        return torch.frombuffer(buffer, dtype=torch.uint8)


def _map(fd: int, size: int, writable: bool) -> mmap.mmap:
    # MAP_POPULATE maps every page in one call instead of one fault per 4 KiB page on first touch
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=prot)


def file_checksum(path: str) -> str:
    """WeightFile.checksum: weights_checksum over the file's bytes, hashed straight from a mapping (in
    /dev/shm the hash reads the very pages the learner wrote)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return weights_checksum([])
        with _map(f.fileno(), size, writable=False) as mapped:
            return weights_checksum([mapped])


def _header(tensors: list[tuple[str, torch.Tensor]]) -> tuple[bytes, list[int]]:
    """The file's first bytes (length + JSON header, padded so the data starts 8-byte aligned) and
    each tensor's data offset in the file."""
    entries, offsets, offset = {}, [], 0
    for name, t in tensors:
        if t.dtype not in SAFETENSORS_DTYPES:
            raise WeightFileError(f"tensor {name}: dtype {t.dtype} not supported")
        size = t.numel() * t.element_size()
        entries[name] = {
            "dtype": SAFETENSORS_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offsets.append(offset)
        offset += size
    blob = json.dumps(entries, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    head = struct.pack("<Q", len(blob)) + blob
    return head, [len(head) + o for o in offsets]


def write_weight_file(path: str | Path, tensors: list[tuple[str, torch.Tensor]]) -> str:
    """Write the tensors (any device) as one safetensors file at `path`, in place when it exists,
    under an exclusive lock (it waits for servers still loading the previous contents); returns
    its file_checksum."""
    head, offsets = _header(tensors)
    size = offsets[-1] + tensors[-1][1].numel() * tensors[-1][1].element_size() if tensors else len(head)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
        with _map(fd, size, writable=True) as mapped:
            mapped[: len(head)] = head
            data = bytes_tensor(mapped)
            for (_, t), offset in zip(tensors, offsets):
                source = t.detach().contiguous().view(-1).view(torch.uint8)  # bytes: any alignment in the file
                data[offset : offset + source.numel()].copy_(source)
            del data  # the mapping cannot close while a tensor views it
            digest = weights_checksum([mapped])
    finally:
        os.close(fd)  # releases the lock
    return digest


@contextlib.contextmanager
def mapped_weights(path: str | Path):
    """The file's tensors as (name, tensor) views of a read-only mapping, in file order; valid
    inside the `with` block (copy what must outlive it)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise WeightFileError(f"{path}: {size} bytes is not a safetensors file")
        mapped = _map(f.fileno(), size, writable=False)
    try:
        (header_len,) = struct.unpack("<Q", mapped[:8])
        if 8 + header_len > size:
            raise WeightFileError(f"{path}: header of {header_len} bytes in a {size}-byte file")
        try:
            header = json.loads(mapped[8 : 8 + header_len])
        except ValueError as exc:
            raise WeightFileError(f"{path}: header is not JSON ({exc})") from None
        if not isinstance(header, dict) or not header.keys() - {"__metadata__"}:
            raise WeightFileError(f"{path}: no tensors in the header")
        header.pop("__metadata__", None)
        data = bytes_tensor(mapped)
        tensors = []
        for name, entry in header.items():
            start, end = (8 + header_len + o for o in entry["data_offsets"])
            dtype = _TORCH_DTYPES.get(entry["dtype"])
            if (
                dtype is None
                or not 8 + header_len <= start <= end <= size
                or end - start != math.prod(entry["shape"]) * dtype.itemsize
            ):
                raise WeightFileError(
                    f"{path}: tensor {name}: dtype {entry['dtype']}, shape {entry['shape']} or offsets {entry['data_offsets']} out of range"
                )
            raw = data[start:end]
            if start % dtype.itemsize:  # another writer's unaligned layout: copy this one
                raw = raw.clone()
            tensors.append((name, raw.view(dtype).view(entry["shape"])))
        del data
        yield tensors
    finally:
        tensors = None
        try:
            mapped.close()
        except BufferError:  # a caller kept a view: the mapping goes when the last view does
            pass


@contextlib.contextmanager
def shared_lock(path: str | Path):
    """Hold the file against rewrites (write_weight_file) while it is verified and loaded."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def concat_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(parts) along dim 0, as a view with no copy when the parts lie back to back in one
    storage (mapped_weights of a file written in the model's own order)."""
    first = parts[0]
    adjacent = all(
        p.is_contiguous()
        and p.dtype == first.dtype
        and p.shape[1:] == first.shape[1:]
        and p.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        for p in parts
    ) and all(a.data_ptr() + a.numel() * a.element_size() == b.data_ptr() for a, b in zip(parts, parts[1:]))
    if not adjacent:
        return torch.cat(parts)
    shape = (sum(p.shape[0] for p in parts), *first.shape[1:])
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), shape)
