"""Export -> import round trip of a memory store keeps every entry, its order and retrieval."""

from __future__ import annotations

import numpy as np

from memory_service.admin import export_store, import_store
from memory_service.store import Entry, MemoryStore


def _unit(v):
    v = np.asarray(v, np.float32)
    return v / np.linalg.norm(v)


def test_export_import_round_trip(tmp_path):
    src = MemoryStore(tmp_path / "a.sqlite", capacity=10)
    src.add(
        "t/0", [Entry("tip a", 50.0, "s1"), Entry("tip b", 90.0, "s2")], np.stack([_unit([1, 0, 0]), _unit([1, 1, 0])])
    )
    src.add("t/1", [Entry("tip c", 10.0, "s3")], np.stack([_unit([0, 0, 1])]))
    src.close()

    assert export_store(str(tmp_path / "a.sqlite"), str(tmp_path / "m.jsonl")) == 3
    assert import_store(str(tmp_path / "m.jsonl"), str(tmp_path / "b.sqlite"), capacity=10) == 3
    assert import_store(str(tmp_path / "m.jsonl"), str(tmp_path / "b.sqlite"), capacity=10) == 0  # dedup

    dst = MemoryStore(tmp_path / "b.sqlite", capacity=10)
    hits = dst.retrieve("t/0", _unit([1, 0.5, 0]), threshold=0.5, top_k=10)
    assert [e.tip for e, _ in hits] == ["tip b", "tip a"]  # score order survives the trip
    assert [e.tip for e, _ in dst.retrieve("t/1", _unit([0, 0, 1]), 0.5, 10)] == ["tip c"]
    assert dst.stats() == (2, 3)


def test_import_respects_the_fifo_cap(tmp_path):
    src = MemoryStore(tmp_path / "a.sqlite", capacity=10)
    src.add(
        "k", [Entry(f"tip {i}", float(i), f"s{i}") for i in range(4)], np.stack([_unit([1, i, 0]) for i in range(4)])
    )
    src.close()
    export_store(str(tmp_path / "a.sqlite"), str(tmp_path / "m.jsonl"))
    import_store(str(tmp_path / "m.jsonl"), str(tmp_path / "b.sqlite"), capacity=2)
    dst = MemoryStore(tmp_path / "b.sqlite", capacity=2)
    assert sorted(e.tip for e, _ in dst.retrieve("k", _unit([1, 2, 0]), -1.0, 10)) == [
        "tip 2",
        "tip 3",
    ]  # oldest evicted
