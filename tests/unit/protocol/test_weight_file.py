"""The weight file of file-based updates: safetensors-compatible, rewritten in place, read as views
of a mapping (fused rows without a copy), guarded by flock, and bad files refused clearly."""

from __future__ import annotations

import json
import os
import struct
import threading

import pytest
import torch
from safetensors import safe_open

from protocol.weight_file import (
    WeightFileError,
    concat_rows,
    file_checksum,
    mapped_weights,
    shared_lock,
    write_weight_file,
)


def tensors(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("q.weight", torch.randn(4, 3, generator=g)),
        ("k.weight", torch.randn(2, 3, generator=g)),
        ("odd.bias", torch.randn(7, generator=g).to(torch.bfloat16)),  # 14 bytes: what follows is unaligned
        ("norm.weight", torch.randn(5, generator=g)),
        ("half", torch.randn(2, 2, generator=g).to(torch.float16)),
    ]


def test_written_file_is_safetensors_and_reads_back_as_views(tmp_path):
    path = tmp_path / "w.safetensors"
    digest = write_weight_file(path, tensors())
    assert digest == file_checksum(str(path))
    with safe_open(str(path), framework="pt") as f:  # the reference reader agrees, byte for byte
        for name, t in tensors():
            assert torch.equal(f.get_tensor(name), t)
    with mapped_weights(path) as mapped:
        assert [n for n, _ in mapped] == [n for n, _ in tensors()]  # the writer's order is kept
        for (_, got), (_, want) in zip(mapped, tensors()):
            assert got.dtype == want.dtype and torch.equal(got, want)


def test_rewrite_in_place_keeps_the_file_and_changes_the_checksum(tmp_path):
    path = tmp_path / "w.safetensors"
    first = write_weight_file(path, tensors(0))
    inode = os.stat(path).st_ino
    second = write_weight_file(path, tensors(1))
    assert os.stat(path).st_ino == inode and first != second
    with mapped_weights(path) as mapped:
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(mapped, tensors(1)))
    write_weight_file(path, tensors(1)[:2])  # a smaller update shrinks the file to fit
    with mapped_weights(path) as mapped:
        assert [n for n, _ in mapped] == ["q.weight", "k.weight"]


def test_concat_rows_is_a_view_only_for_back_to_back_parts(tmp_path):
    path = tmp_path / "w.safetensors"
    write_weight_file(path, tensors())
    with mapped_weights(path) as mapped:
        parts = dict(mapped)
        fused = concat_rows([parts["q.weight"], parts["k.weight"]])
        assert fused.data_ptr() == parts["q.weight"].data_ptr()  # no copy
        assert torch.equal(fused, torch.cat([parts["q.weight"], parts["k.weight"]]))
        swapped = concat_rows([parts["k.weight"], parts["q.weight"]])  # not in file order: a real concatenation
        assert swapped.data_ptr() != parts["k.weight"].data_ptr()
        assert torch.equal(swapped, torch.cat([parts["k.weight"], parts["q.weight"]]))


def test_writer_waits_for_a_reader_holding_the_file(tmp_path):
    path = tmp_path / "w.safetensors"
    write_weight_file(path, tensors(0))
    done = threading.Event()
    with shared_lock(path):
        writer = threading.Thread(target=lambda: (write_weight_file(path, tensors(1)), done.set()))
        writer.start()
        assert not done.wait(0.3)  # blocked while a server verifies and loads
    writer.join(10)
    assert done.is_set()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"1234",  # too short
        struct.pack("<Q", 1 << 40) + b"{}",  # header longer than the file
        struct.pack("<Q", 2) + b"{}" + b"x" * 8,  # no tensors
        struct.pack("<Q", 4) + b"{{{{" + b"x" * 8,  # not JSON
    ],
)
def test_malformed_files_are_refused(tmp_path, content):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(WeightFileError):
        with mapped_weights(path):
            pass


@pytest.mark.parametrize(
    "entry",
    [
        {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 20]},  # past the end
        {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]},  # size disagrees with the shape
        {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]},  # not a weight dtype
    ],
)
def test_bad_tensor_entries_are_refused(tmp_path, entry):
    header = json.dumps({"w": entry}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    with pytest.raises(WeightFileError, match="out of range"):
        with mapped_weights(path):
            pass
