"""The memory service's door (issue 14): a huge query state, an unknown task, an over-long report
are refused with a reason before any embedding; a full reflection queue (bytes) answers Wait; a
stored row without a finite score (SQLite keeps a NaN as NULL) is dropped at start-up instead of
breaking every MemoryResult that would retrieve it."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from common.server import dispatch
from memory_service.service import MemoryService, report_bytes
from memory_service.store import Entry, MemoryStore
from pipeline.cli import given
from pipeline.config import load_config
from protocol.codec import decode, encode
from protocol.messages import Ack, EpisodeReport, ErrorReply, MemoryQuery, MemoryResult, Wait


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("memory")
    cfg = load_config([f"run_dir={run_dir}", "replay_buffer.tasks=[boil]", "tta.tasks=[melt]"])
    service = MemoryService(**given("empo2-memory-service", cfg))
    yield service
    service.close()


def call(service, msg):
    return dispatch(service.handlers, msg, service.metrics, limits=service.limits)


@pytest.mark.parametrize(
    "message, reason",
    [
        (MemoryQuery(task="boil", variation=0, state="s" * (32 << 20)), "too_long"),  # 32 MiB: no 74 s embedding
        (MemoryQuery(task="task-0042", variation=0, state="s"), "task"),
        (EpisodeReport("e", "boil", 0, "d", 5.0, ["o" * 20_000], ["a"]), "too_long"),
        (EpisodeReport("e", "boil", 0, "d", 5.0, ["o"] * 500, ["a"] * 500), "too_long"),  # more turns than any limit
    ],
)
def test_refused_at_the_door_with_its_reason(service, message, reason):
    before = service.metrics.registry.get_sample_value(
        "empo2_memory_service_messages_rejected_total", {"reason": reason}
    )
    reply = call(service, message)
    assert isinstance(reply, ErrorReply) and reply.reason == reason
    after = service.metrics.registry.get_sample_value(
        "empo2_memory_service_messages_rejected_total", {"reason": reason}
    )
    assert after == (before or 0) + 1
    assert service.reports.empty()


def test_the_run_s_tasks_are_served(service):
    assert isinstance(call(service, MemoryQuery(task="melt", variation=3, state="a kitchen")), MemoryResult)


def test_a_full_reflection_queue_answers_wait(service, monkeypatch):
    report = EpisodeReport("e", "boil", 0, "boil water", 5.0, ["a kitchen"], ["look around"])
    monkeypatch.setattr(service.run_facts.security, "max_reflection_queue_bytes", report_bytes(report))
    assert call(service, report) == Ack(ref="e", detail="queued for reflection")
    assert isinstance(call(service, report), Wait)  # the first one still waits for its reflection
    _, queued = service.reports.get_nowait()  # (pending id in the store, report)
    service.release_report(queued)
    assert service.queued_bytes == 0


def test_a_stored_nan_score_never_breaks_a_result_after_restart(tmp_path):
    db = tmp_path / "memory.sqlite"
    store = MemoryStore(db, capacity=10)
    vector = np.array([1, 0, 0, 0], np.float32)
    store.add("boil/0", [Entry("good tip", 10.0, "s1"), Entry("nan tip", float("nan"), "s2")], np.stack([vector] * 2))
    store.close()
    con = sqlite3.connect(str(db))  # a row written before scores were checked: SQLite holds NaN as NULL
    with con:
        con.execute(
            "INSERT INTO entries (key, tip, score, state, vector) VALUES (?, ?, ?, ?, ?)",
            ("boil/0", "old nan tip", float("nan"), "s3", vector.tobytes()),
        )
    con.close()
    store = MemoryStore(db, capacity=10)
    try:
        assert store.unusable_rows == 1
        hits = store.retrieve("boil/0", vector, 0.5, 10)
        assert [e.tip for e, _ in hits] == ["good tip"]
        result = MemoryResult(tips=[e.tip for e, _ in hits], scores=[e.score for e, _ in hits], count=len(hits))
        assert decode(encode(result)) == result
    finally:
        store.close()


def test_queries_answered_together_get_what_each_would_get_alone(service, monkeypatch):
    """memory_service.query_batch: one embedding call for the queries waiting together; every answer
    is the one a lone query gets (the same tips in the same order, the same count). Without the
    embedding cache, so that every lone query is embedded alone (the cache: test_embedding_cache.py)."""
    monkeypatch.setattr(service.embedder, "cache_texts", 0)
    service.embedder.cache.clear()
    states = [f"This room is called the kitchen. In it, you see: a fridge and item {i}." for i in range(6)]
    vectors = service.embed(states)
    key = "boil/0"
    service.store.add(key, [Entry(f"tip {i}", float(10 * i), s) for i, s in enumerate(states)], vectors)
    queries = [MemoryQuery(task="boil", variation=0, state=s) for s in [*states[:3], "a bathroom with a sink"]]
    together = service.retrieve_batch(queries)
    alone = [service.retrieve(q) for q in queries]
    assert [(r.tips, r.count) for r in together] == [(r.tips, r.count) for r in alone]
    assert np.allclose([r.scores for r in together[:3]], [r.scores for r in alone[:3]])
    assert together[0].count > 0  # a stored state finds its own entry
