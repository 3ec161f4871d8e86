"""A real memory service with a real policy server: the current policy writes the reflection,
tips are stored per step and retrieved for a similar state, and a restarted service still has
every accepted entry."""

from __future__ import annotations

import time

import pytest
import zmq

from common.config import MetricsConfig
from deploy.monitor import scrape
from protocol import Client
from protocol.messages import Ack, EpisodeReport, MemoryQuery, MemoryResult
from protocol.transport import wait_until_ready

pytestmark = pytest.mark.integration
POLICY, MEMORY, METRICS_BASE = "tcp://127.0.0.1:26550", "tcp://127.0.0.1:26570", 29200

KITCHEN = (
    "This room is called the kitchen. In it, you see: a fridge, a counter, a sink, a red box, "
    "an oven. You also see: a door to the hallway (that is open)."
)
HALLWAY = (
    "This room is called the hallway. In it, you see: a picture, a substance called air. You also "
    "see: a door to the kitchen (that is open), a door to the greenhouse (that is open)."
)


def _query(client: Client, state: str) -> MemoryResult:
    result = client.call(MemoryQuery(task="find-living-thing", variation=0, state=state))
    assert isinstance(result, MemoryResult)
    return result


def test_reflection_storage_retrieval_and_restart(start_role, tmp_path):
    overrides = [
        f"endpoints.policy_servers=[{POLICY}]",
        f"endpoints.memory_service={MEMORY}",
        f"metrics.base_port={METRICS_BASE}",
        f"run_dir={tmp_path}",
    ]
    start_role("empo2-policy-server", overrides, "policy_server")
    memory_proc = start_role("empo2-memory-service", overrides, "memory_service")
    ctx = zmq.Context.instance()
    memory = Client(ctx, MEMORY, timeout_s=30)
    wait_until_ready(memory, "test", timeout_s=300)
    wait_until_ready(Client(ctx, POLICY, timeout_s=30), "test", timeout_s=600)

    assert _query(memory, HALLWAY).count == 0  # empty memory: n = 0
    report = EpisodeReport(
        episode_id="ep1",
        task="find-living-thing",
        variation=0,
        task_description="Your task is to find a(n) living thing.",
        score=40.0,
        observations=[HALLWAY, KITCHEN],
        actions=["teleport to kitchen", "open fridge"],
    )
    assert isinstance(memory.call(report), Ack)

    deadline = time.monotonic() + 600
    while (result := _query(memory, HALLWAY)).count == 0:
        assert time.monotonic() < deadline, memory_proc.log()[-3000:]
        time.sleep(2)
    metrics = scrape("127.0.0.1", MetricsConfig(base_port=METRICS_BASE).port("memory_service"))
    assert metrics["empo2_memory_service_reflections_total"] == 1
    assert metrics["empo2_memory_service_entries"] == 2  # one entry per step
    assert metrics["empo2_memory_service_policy_version"] == 0  # written by the served policy
    # the hallway state retrieves (at least) its own step's tip, with the stored score
    assert any(
        "The action you took was teleport to kitchen; eventually you got score 40/100." in t for t in result.tips
    )
    assert result.scores[0] == 40.0
    assert _query(memory, "zzzz qqqq 12345").count == 0  # an unrelated state stays under the threshold
    assert _query(memory, HALLWAY).count == _query(memory, HALLWAY).count  # retrieval is read-only

    memory_proc.stop()
    restarted = start_role("empo2-memory-service", overrides, "memory_service_restarted")
    memory = Client(ctx, MEMORY, timeout_s=30)
    wait_until_ready(memory, "test", timeout_s=300)
    again = _query(memory, HALLWAY)
    assert again.tips == result.tips and again.count == result.count, restarted.log()[-2000:]
    memory.close()
