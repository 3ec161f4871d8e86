"""memory_service.store: cosine retrieval, ordering, keys, FIFO cap, dedup and SQLite restart.

Vectors are crafted 4-d unit vectors (no embedder): an entry at cosine c to the query
e0 = [1, 0, 0, 0] is [c, sqrt(1 - c^2), 0, 0].
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from memory_service.store import Entry, MemoryStore, memory_key

QUERY = np.array([1.0, 0.0, 0.0, 0.0], np.float32)


def at_cos(c: float, plane: int = 1) -> np.ndarray:
    """Unit vector with cosine c to QUERY (the rest of its length along axis `plane`)."""
    v = np.zeros(4, np.float32)
    v[0] = c
    v[plane] = math.sqrt(max(0.0, 1.0 - c * c))
    return v


def entry(name: str, score: float = 0.0, state: str | None = None) -> Entry:
    return Entry(tip=f"tip {name}", score=score, state=state if state is not None else f"state {name}")


def tips(results) -> list[str]:
    return [e.tip for e, _ in results]


def db_tips(path: Path, key: str | None = None) -> list[str]:
    con = sqlite3.connect(str(path))
    try:
        if key is None:
            rows = con.execute("SELECT tip FROM entries ORDER BY id").fetchall()
        else:
            rows = con.execute("SELECT tip FROM entries WHERE key = ? ORDER BY id", (key,)).fetchall()
    finally:
        con.close()
    return [r[0] for r in rows]


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "memory.sqlite"


@pytest.fixture
def open_store(db_path):
    stores: list[MemoryStore] = []

    def make(capacity: int = 1000) -> MemoryStore:
        store = MemoryStore(db_path, capacity=capacity)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


# ------------------------------------------------------------------------------------ keys


@pytest.mark.parametrize(
    "kind, expected",
    [("task_variation", "boil/3"), ("task", "boil"), ("global", "*")],
)
def test_memory_key_kinds(kind, expected):
    assert memory_key(kind, "boil", 3) == expected


def test_memory_key_distinguishes_variations_only_in_task_variation_mode():
    assert memory_key("task_variation", "boil", 1) != memory_key("task_variation", "boil", 2)
    assert memory_key("task", "boil", 1) == memory_key("task", "boil", 2)
    assert memory_key("global", "boil", 1) == memory_key("global", "melt", 9)


@pytest.mark.parametrize("kind", ["variation", "", "Task", "per_task"])
def test_memory_key_rejects_other_kinds(kind):
    with pytest.raises(ValueError, match="task_variation\\|task\\|global"):
        memory_key(kind, "boil", 1)


# ------------------------------------------------------------------------------- retrieval


def test_retrieve_returns_only_entries_strictly_above_the_threshold(open_store):
    store = open_store()
    names = ["high", "at", "low", "opposite", "orthogonal"]
    cosines = [0.9, 0.5, 0.3, -0.8, 0.0]
    assert store.add("k", [entry(n) for n in names], np.stack([at_cos(c) for c in cosines])) == 5
    results = store.retrieve("k", QUERY, threshold=0.5, top_k=10)
    assert tips(results) == ["tip high"]  # exactly 0.5 is not "over" the threshold
    assert results[0][1] == pytest.approx(0.9, abs=1e-6)
    assert set(tips(store.retrieve("k", QUERY, threshold=0.49, top_k=10))) == {"tip high", "tip at"}
    assert store.retrieve("k", QUERY, threshold=0.95, top_k=10) == []


def test_retrieve_orders_by_stored_score_then_similarity(open_store):
    store = open_store()
    items = [("ten", 10.0, 0.6), ("fifty_near", 50.0, 0.95), ("hundred", 100.0, 0.55), ("fifty_far", 50.0, 0.7)]
    store.add("k", [entry(n, s) for n, s, _ in items], np.stack([at_cos(c) for _, _, c in items]))
    results = store.retrieve("k", QUERY, threshold=0.5, top_k=10)
    assert tips(results) == ["tip hundred", "tip fifty_near", "tip fifty_far", "tip ten"]
    assert [e.score for e, _ in results] == [100.0, 50.0, 50.0, 10.0]
    assert [round(s, 5) for _, s in results] == [0.55, 0.95, 0.7, 0.6]
    assert all(isinstance(s, float) for _, s in results)


def test_retrieve_truncates_to_top_k_after_ordering(open_store):
    store = open_store()
    scores = [5.0, 80.0, 20.0, 60.0, 40.0]
    store.add("k", [entry(f"s{int(s)}", s) for s in scores], np.stack([at_cos(0.8)] * 5))
    assert tips(store.retrieve("k", QUERY, 0.5, top_k=3)) == ["tip s80", "tip s60", "tip s40"]
    assert tips(store.retrieve("k", QUERY, 0.5, top_k=1)) == ["tip s80"]
    assert store.retrieve("k", QUERY, 0.5, top_k=0) == []


def test_retrieve_reads_only_the_requested_key(open_store):
    store = open_store()
    vec = np.stack([at_cos(0.9)])
    store.add(memory_key("task_variation", "boil", 1), [entry("boil1", 10.0)], vec)
    store.add(memory_key("task_variation", "boil", 2), [entry("boil2", 90.0)], vec)
    store.add(memory_key("task", "boil", 1), [entry("boil_any", 50.0)], vec)
    assert tips(store.retrieve("boil/1", QUERY, 0.5, 10)) == ["tip boil1"]
    assert tips(store.retrieve("boil/2", QUERY, 0.5, 10)) == ["tip boil2"]
    assert tips(store.retrieve("boil", QUERY, 0.5, 10)) == ["tip boil_any"]
    assert store.retrieve("melt/1", QUERY, 0.5, 10) == []
    assert store.stats() == (3, 3)


def test_retrieve_uses_the_stored_vector_of_each_entry(open_store):
    store = open_store()
    store.add("k", [entry("x_axis"), entry("y_axis")], np.stack([at_cos(1.0), at_cos(0.0, plane=2)]))
    y_query = np.array([0.0, 0.0, 1.0, 0.0], np.float32)
    assert tips(store.retrieve("k", y_query, 0.5, 10)) == ["tip y_axis"]
    assert tips(store.retrieve("k", QUERY, 0.5, 10)) == ["tip x_axis"]


# ------------------------------------------------------------------------------ duplicates


def test_exact_duplicates_are_dropped_and_not_counted(open_store, db_path):
    store = open_store()
    vec = np.stack([at_cos(0.9)])
    assert store.add("k", [entry("a", 10.0)], vec) == 1
    assert store.add("k", [entry("a", 99.0)], vec) == 0  # same tip and state: a duplicate
    assert store.add("k", [Entry("tip a", 10.0, "another state")], vec) == 1  # same tip, new state
    assert store.add("k", [Entry("another tip", 10.0, "state a")], vec) == 1  # same state, new tip
    assert store.stats() == (1, 3)
    assert db_tips(db_path) == ["tip a", "tip a", "another tip"]
    assert [e.score for e, _ in store.retrieve("k", QUERY, 0.5, 10)] == [10.0, 10.0, 10.0]


def test_duplicates_within_one_add_call_count_once(open_store):
    store = open_store()
    added = store.add("k", [entry("a"), entry("a"), entry("b")], np.stack([at_cos(0.9)] * 3))
    assert added == 2
    assert sorted(tips(store.retrieve("k", QUERY, 0.5, 10))) == ["tip a", "tip b"]


def test_the_same_entry_under_another_key_is_not_a_duplicate(open_store):
    store = open_store()
    vec = np.stack([at_cos(0.9)])
    assert store.add("boil/1", [entry("a")], vec) == 1
    assert store.add("boil/2", [entry("a")], vec) == 1
    assert store.stats() == (2, 2)


# ------------------------------------------------------------------------------------ FIFO


def test_fifo_cap_evicts_the_oldest_entries_first(open_store, db_path):
    store = open_store(capacity=3)
    for i in range(5):
        assert store.add("k", [entry(f"e{i}", score=float(i))], np.stack([at_cos(0.9)])) == 1
    assert store.stats() == (1, 3)
    assert sorted(tips(store.retrieve("k", QUERY, 0.5, 10))) == ["tip e2", "tip e3", "tip e4"]
    assert db_tips(db_path) == ["tip e2", "tip e3", "tip e4"]  # evicted rows deleted in SQLite


def test_fifo_cap_within_a_single_add_call(open_store, db_path):
    store = open_store(capacity=2)
    added = store.add("k", [entry(f"e{i}") for i in range(4)], np.stack([at_cos(0.9)] * 4))
    assert added == 4
    assert db_tips(db_path) == ["tip e2", "tip e3"]
    assert sorted(tips(store.retrieve("k", QUERY, 0.5, 10))) == ["tip e2", "tip e3"]


def test_evicted_entries_stay_gone_after_reopening(open_store, db_path):
    store = open_store(capacity=2)
    for i in range(4):
        store.add("k", [entry(f"e{i}")], np.stack([at_cos(0.9)]))
    store.close()
    reopened = open_store(capacity=2)
    assert reopened.stats() == (1, 2)
    assert sorted(tips(reopened.retrieve("k", QUERY, 0.5, 10))) == ["tip e2", "tip e3"]


def test_fifo_cap_is_per_key(open_store, db_path):
    store = open_store(capacity=2)
    vec = np.stack([at_cos(0.9)])
    store.add("other", [entry("keep")], vec)
    for i in range(3):
        store.add("k", [entry(f"e{i}")], vec)
    assert tips(store.retrieve("other", QUERY, 0.5, 10)) == ["tip keep"]
    assert db_tips(db_path, "other") == ["tip keep"]
    assert db_tips(db_path, "k") == ["tip e1", "tip e2"]


def test_an_evicted_entry_can_be_added_again(open_store):
    store = open_store(capacity=2)
    vec = np.stack([at_cos(0.9)])
    for name in ("a", "b", "c"):
        store.add("k", [entry(name)], vec)
    assert store.add("k", [entry("a")], vec) == 1  # no longer held, so not a duplicate
    assert sorted(tips(store.retrieve("k", QUERY, 0.5, 10))) == ["tip a", "tip c"]


def test_fifo_order_continues_across_a_restart(open_store, db_path):
    store = open_store(capacity=2)
    vec = np.stack([at_cos(0.9)])
    store.add("k", [entry("a")], vec)
    store.add("k", [entry("b")], vec)
    store.close()
    reopened = open_store(capacity=2)
    assert reopened.add("k", [entry("c")], vec) == 1
    assert db_tips(db_path) == ["tip b", "tip c"]  # "a" was the oldest


# --------------------------------------------------------------------------------- restart


def test_a_new_store_on_the_same_file_restores_every_accepted_entry(open_store):
    store = open_store()
    rng = np.random.default_rng(0)
    keys = ["boil/1", "boil/2", "*"]
    for key in keys:
        raw = rng.normal(size=(6, 4)).astype(np.float32)
        vectors = raw / np.linalg.norm(raw, axis=1, keepdims=True)
        entries = [Entry(f"{key} tip {i}", float(rng.integers(0, 100)), f"{key} state {i}") for i in range(6)]
        assert store.add(key, entries, vectors) == 6
    assert store.add("boil/1", [Entry("boil/1 tip 0", 1.0, "boil/1 state 0")], np.stack([at_cos(1.0)])) == 0
    queries = [QUERY, at_cos(0.3, plane=2), np.array([0.0, 0.0, 0.6, 0.8], np.float32), -QUERY]
    before = {(key, qi): store.retrieve(key, q, -1.0, 100) for key in keys for qi, q in enumerate(queries)}
    stats = store.stats()
    store.close()

    restarted = open_store()
    assert restarted.stats() == stats == (3, 18)
    for (key, qi), results in before.items():
        after = restarted.retrieve(key, queries[qi], -1.0, 100)
        assert [e for e, _ in after] == [e for e, _ in results]
        assert [s for _, s in after] == [s for _, s in results]  # float32 vectors restored exactly
        assert len(after) == 6
    # dedup state is restored too
    assert restarted.add("boil/1", [Entry("boil/1 tip 0", 1.0, "boil/1 state 0")], np.stack([at_cos(1.0)])) == 0
    assert restarted.add("boil/1", [Entry("new tip", 1.0, "new state")], np.stack([at_cos(1.0)])) == 1
    assert restarted.stats() == (3, 19)


def test_restart_without_close_keeps_committed_entries(db_path):
    store = MemoryStore(db_path, capacity=10)
    try:
        store.add("k", [entry("committed", 42.0)], np.stack([at_cos(0.9)]))
        # a second process opening the file while the first is still running (crash-like)
        other = MemoryStore(db_path, capacity=10)
        try:
            results = other.retrieve("k", QUERY, 0.5, 10)
            assert [(e.tip, e.score, e.state) for e, _ in results] == [("tip committed", 42.0, "state committed")]
        finally:
            other.close()
    finally:
        store.close()


def test_empty_store_retrieves_nothing(open_store):
    store = open_store()
    assert store.retrieve("k", QUERY, -1.0, 10) == []
    assert store.stats() == (0, 0)


# ----------------------------------------------------------------------- the reflection queue


def test_queued_reports_persist_until_their_entries_are_stored_in_the_same_transaction(tmp_path):
    path = tmp_path / "m.sqlite"
    store = MemoryStore(path, capacity=10)
    first = store.queue_report("ep1", b"record 1")
    second = store.queue_report("ep2", b"record 2")
    assert store.queue_report("ep1", b"again") is None  # one queued report per episode
    store.close()  # (a kill -9 loses nothing more: each queue_report was committed)
    store = MemoryStore(path, capacity=10)
    assert store.pending_reports() == [(first, b"record 1"), (second, b"record 2")]
    store.add("k", [entry("a")], np.stack([at_cos(0.9)]), done_report=first)
    assert store.pending_reports() == [(second, b"record 2")]
    store.close()
    store = MemoryStore(path, capacity=10)
    assert tips(store.retrieve("k", QUERY, 0.5, 10)) == ["tip a"]
    assert store.pending_reports() == [(second, b"record 2")]
    store.close()


def test_a_report_whose_reflection_keeps_failing_is_given_up_after_its_attempts(tmp_path):
    store = MemoryStore(tmp_path / "m.sqlite", capacity=10)
    report = store.queue_report("ep", b"r")
    assert store.report_failed(report, max_attempts=3)
    assert store.report_failed(report, max_attempts=3)
    assert not store.report_failed(report, max_attempts=3)
    assert store.pending_reports() == []
    store.close()
