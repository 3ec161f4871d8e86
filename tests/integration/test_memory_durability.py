"""Acknowledged, then lost (issue 14): a real memory service acknowledges episode reports while no
policy server can reflect on them, is stopped with SIGSTOP (an actor's retrieval times out and its
turn goes without tips) and killed with kill -9 with the reports queued; restarted next to a real
policy server, it stores every acknowledged report."""

from __future__ import annotations

import signal
import sqlite3
import time

import pytest
import zmq

from actors.env_actor.worker import EnvWorker
from common.config import MetricsConfig
from common.process import signal_group, wait_group
from deploy.monitor import scrape
from pipeline.cli import given
from pipeline.config import load_config
from protocol import Client
from protocol.messages import Ack, EpisodeReport
from protocol.transport import wait_until_ready

pytestmark = pytest.mark.integration
POLICY, MEMORY, METRICS_BASE = "tcp://127.0.0.1:28550", "tcp://127.0.0.1:28570", 31000
REPORTS = 10


def report(i: int) -> EpisodeReport:
    return EpisodeReport(
        episode_id=f"ep{i}",
        task="find-living-thing",
        variation=0,
        task_description="Your task is to find a(n) living thing.",
        score=float(i),
        observations=[f"This room is called the kitchen {i}.", f"This room is called the hallway {i}."],
        actions=[f"open door {i}", f"look around {i}"],
    )


def pending(db) -> int:
    con = sqlite3.connect(str(db))
    try:
        return con.execute("SELECT COUNT(*) FROM pending_reports").fetchone()[0]
    finally:
        con.close()


def test_every_acknowledged_report_is_stored_after_a_kill_9(start_role, tmp_path):
    overrides = [
        f"endpoints.policy_servers=[{POLICY}]",
        f"endpoints.memory_service={MEMORY}",
        f"metrics.base_port={METRICS_BASE}",
        f"run_dir={tmp_path}",
        "memory_service.reflection_max_tokens=24",
    ]
    # no policy server yet: the reflection worker waits on its first batch, the rest stays queued
    first = start_role("empo2-memory-service", [*overrides, "memory_service.reflection_timeout_s=600"], "memory_1")
    ctx = zmq.Context.instance()
    memory = Client(ctx, MEMORY, timeout_s=30)
    wait_until_ready(memory, "test", timeout_s=300)
    for i in range(REPORTS):
        assert isinstance(memory.call(report(i)), Ack)
    memory.close()
    assert pending(tmp_path / "memory.sqlite") == REPORTS  # on disk before each Ack

    # hung (SIGSTOP): an actor's retrieval times out and the turn goes on without tips
    signal_group(first.proc, signal.SIGSTOP)
    worker = EnvWorker(**given("empo2-env-actor", load_config([*overrides, "env_actor.memory_timeout_s=1.0"])))
    try:
        t0 = time.monotonic()
        assert worker.retrieve("find-living-thing", 0, "kitchen") is None
        assert time.monotonic() - t0 < 5
    finally:
        worker.close()

    signal_group(first.proc, signal.SIGKILL)  # kill -9, reports queued
    assert wait_group(first.proc, time.monotonic() + 10)
    assert pending(tmp_path / "memory.sqlite") == REPORTS

    start_role("empo2-policy-server", overrides, "policy_server")
    restarted = start_role("empo2-memory-service", overrides, "memory_2")
    wait_until_ready(Client(ctx, POLICY, timeout_s=30), "test", timeout_s=600)
    port = MetricsConfig(base_port=METRICS_BASE).port("memory_service")
    deadline = time.monotonic() + 600
    while pending(tmp_path / "memory.sqlite"):
        assert time.monotonic() < deadline, restarted.log()[-3000:]
        time.sleep(2)
    metrics = scrape("127.0.0.1", port)
    assert metrics.get("empo2_memory_service_reports_given_up_total") == 0
    assert metrics["empo2_memory_service_reflections_total"] == REPORTS
    assert metrics["empo2_memory_service_entries"] == 2 * REPORTS  # one entry per step of every report
    assert "resuming 10 episode reports queued before the restart" in restarted.log()
