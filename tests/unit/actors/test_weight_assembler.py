"""The policy server's assembly of WeightChunk messages (actors/policy_server/weight_receiver.py): an update is
staged once all its chunks are there and the checksum matches; a newer version replaces an
unfinished one; an update that holds more bytes than the bound is dropped and refused, so chunks
that never complete cannot take the host's memory."""

from __future__ import annotations

import os

import numpy as np
import pytest

from actors.policy_server.weight_receiver import WeightAssembler, WeightUpdateError
from protocol.messages import TensorMeta, WeightChunk
from protocol.weight_file import mapped_weights, weights_checksum


def chunks(version: int, parts: int, floats: int = 16, num_chunks: int | None = None) -> list[WeightChunk]:
    data = [np.arange(floats, dtype=np.float32) + k for k in range(parts)]
    checksum = weights_checksum(memoryview(d.view(np.uint8)) for d in data)
    return [
        WeightChunk(
            version=version,
            chunk_index=k,
            num_chunks=num_chunks or parts,
            tensors=[TensorMeta(f"w{k}", "float32", [floats])],
            data=[d.view(np.uint8)],
            checksum=checksum,
        )
        for k, d in enumerate(data)
    ]


def test_a_complete_update_is_staged_and_a_newer_version_replaces_an_unfinished_one(tmp_path):
    assembler = WeightAssembler(tmp_path, "t", max_bytes=1 << 20)
    old = chunks(1, 3)
    assert assembler.add(old[0]) is None
    new = chunks(2, 2)
    assert assembler.add(new[0]) is None and assembler.add(old[1]) is None  # v1 again: v2's chunk is gone
    assembler.add(new[0])
    staged = assembler.add(new[1])
    with mapped_weights(staged) as tensors:
        values = {name: t.tolist() for name, t in tensors}
    assert sorted(values) == ["w0", "w1"] and values["w1"] == (np.arange(16) + 1).tolist()


def test_chunks_over_the_bound_are_dropped_and_refused(tmp_path):
    many = chunks(1, 40, floats=1024, num_chunks=100_000)  # 4 KiB each, announced as 1 of 100,000
    assembler = WeightAssembler(tmp_path, "t", max_bytes=64 << 10)
    with pytest.raises(WeightUpdateError, match="over the limit"):
        for chunk in many:
            assembler.add(chunk)
    assert assembler._held_bytes == 0 and not assembler._chunks  # nothing kept
    # the same chunk index sent again replaces, it does not add up
    bounded = WeightAssembler(tmp_path, "t", max_bytes=64 << 10)
    for _ in range(100):
        bounded.add(many[0])
    assert bounded._held_bytes == 4096


def test_a_starting_server_removes_the_files_staged_by_dead_servers(tmp_path):
    """A server SIGKILLed between staging an update and the engine's load leaves its file (the chaos
    soak found one in /dev/shm): the next server to start removes it, and leaves a living server's,
    the learner's and other files alone."""
    import subprocess

    from actors.policy_server.weight_receiver import remove_dead_staged_files

    dead = subprocess.Popen(["true"])
    dead.wait()
    names = [
        f"empo2-weights-{dead.pid}-0.safetensors",  # a dead server's staged update
        f"empo2-weights-{os.getpid()}-1.safetensors",  # a living server's
        "empo2-weights-run7.safetensors",  # the learner's shm file (weight_sync.method=shm)
        "psm_1234",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    assert remove_dead_staged_files(tmp_path) == [tmp_path / names[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])
