"""Degradation: with the memory service down, an actor's turn goes without tips, later turns
skip it without asking until the retry delay passes, and it recovers; a report that times out
marks it down for the reports and retrievals that follow. Through the env worker's public
client API (retrieve, report_episode) against a stub server that records what it is asked."""

from __future__ import annotations

import time
from types import SimpleNamespace

from actors.env_actor.config import EnvActorConfig
from actors.env_actor.episode import Episode, EpisodeStats
from actors.env_actor.worker import EnvWorker
from common.config import EndpointsConfig, EnvConfig, RunFacts
from protocol.messages import MemoryResult
from tests.helpers import free_endpoint

TIPS = MemoryResult(tips=["try the kitchen"], scores=[50.0], count=1)


def kinds(server) -> list[str]:
    return [m.KIND for m in server.received]


def _worker(endpoint: str, retry_after_s: float, timeout_s: float = 0.3) -> EnvWorker:
    """An env worker built from its own section alone (no pipeline configuration)."""
    actor = EnvActorConfig(memory_timeout_s=timeout_s, memory_retry_after_s=retry_after_s)
    return EnvWorker(actor, EnvConfig(), RunFacts(endpoints=EndpointsConfig(memory_service=endpoint)))


def test_memory_down_falls_back_then_recovers(stub_server):
    # a timeout long enough for the stub's first answer on a loaded 2-core machine
    endpoint = free_endpoint()
    worker = _worker(endpoint, retry_after_s=1.0, timeout_s=2.0)
    try:
        assert worker.retrieve("t", 0, "state") is None  # nothing listens: fallback after the timeout
        memory = stub_server(lambda msg: TIPS, endpoint)
        # the service is up now, but within the retry delay the actor does not ask it at all
        assert worker.retrieve("t", 0, "state") is None
        assert kinds(memory) == []
        time.sleep(1.1)  # the retry delay has passed: the actor asks again and gets tips
        assert worker.retrieve("t", 0, "state") == (["try the kitchen"], 1)
        assert kinds(memory) == ["memory_query"]
    finally:
        worker.close()


def test_episode_reports_skip_a_down_memory_service(stub_server):
    """A report that times out marks the service down: the next episodes' reports are dropped
    without asking it (counted) instead of each waiting out the timeout."""
    endpoint = free_endpoint()
    worker = _worker(endpoint, retry_after_s=30)
    trajectory = SimpleNamespace(
        episode_id="e", task="t", variation=0, score=0.0, observations=["o"], actions=["a"], strategies=[""],
        strategy_temperature=0.0, inventories_before=lambda: [""],
    )  # fmt: skip
    episode = Episode(trajectory, "task", EpisodeStats())
    try:
        worker.report_episode(episode)  # nothing listens: dropped after the timeout
        memory = stub_server(lambda msg: TIPS, endpoint)
        worker.report_episode(episode)  # marked down: dropped at once
        assert worker.retrieve("t", 0, "state") is None  # retrieval skips it as well
        assert kinds(memory) == []
        dropped = worker.metrics.registry.get_sample_value("empo2_env_actor_errors_total", {"where": "memory_report"})
        assert dropped == 2
    finally:
        worker.close()
