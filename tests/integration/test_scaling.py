"""Independent scaling: two policy servers and three env actor processes (one with two envs)
against one replay buffer. Every server receives traffic and no episode an actor finished is
missing from the buffer or its log."""

from __future__ import annotations

import time

import pytest

from common.config import MetricsConfig
from deploy.monitor import scrape, total
from replay_buffer.buffer import BufferLog, ReplayBuffer
from replay_buffer.config import ReplayBufferConfig

pytestmark = pytest.mark.integration
SERVERS = ["tcp://127.0.0.1:27550", "tcp://127.0.0.1:27551"]
BASE = 29300  # metrics.base_port of this test
PORTS = MetricsConfig(base_port=BASE)  # servers 29300/1, buffer 29400, memory 29401, actors 29600.. (METRICS_PORTS)


def test_two_servers_three_actors(start_role, tmp_path):
    common = [
        f"endpoints.policy_servers=[{','.join(SERVERS)}]",
        "endpoints.replay_buffer=tcp://127.0.0.1:27560",
        "endpoints.memory_service=tcp://127.0.0.1:27570",
        f"metrics.base_port={BASE}",
        f"run_dir={tmp_path}",
        "env.max_steps=2",
        "replay_buffer.group_size=2",
        "replay_buffer.max_open_groups=4",
        "replay_buffer.max_ready_groups=100",
        "replay_buffer.p_memory=0",
        "replay_buffer.variations_per_task=2",
    ]
    roles = [
        start_role("empo2-policy-server", [*common, f"policy_server.index={i}"], f"policy_server{i}") for i in range(2)
    ]
    roles += [
        start_role("empo2-replay-buffer", common, "replay_buffer"),
        start_role("empo2-memory-service", common, "memory_service"),
    ]
    actors = [
        start_role(
            "empo2-env-actor",
            [*common, f"env_actor.index={j}", f"env_actor.envs_per_actor={2 if j == 0 else 1}"],
            f"env_actor{j}",
        )
        for j in range(3)
    ]
    roles += actors
    deadline = time.monotonic() + 900
    while (
        total(scrape("127.0.0.1", PORTS.port("replay_buffer")), "empo2_replay_buffer_trajectories_accepted_total") < 8
    ):
        dead = [r for r in roles if r.proc.poll() is not None]
        assert not dead, "\n".join(r.log()[-2000:] for r in dead)  # a crash fails at once, not at the deadline
        assert time.monotonic() < deadline, "\n".join(a.log()[-1500:] for a in actors)
        time.sleep(3)

    # what the actors say they delivered, then what the buffer holds (an upload may be in flight)
    finished = sum(
        total(scrape("127.0.0.1", PORTS.port("env_actor", j)), "empo2_env_actor_episodes_total") for j in range(3)
    )
    accepted = total(
        scrape("127.0.0.1", PORTS.port("replay_buffer")), "empo2_replay_buffer_trajectories_accepted_total"
    )
    for i in range(2):  # both servers generated
        assert (
            total(scrape("127.0.0.1", PORTS.port("policy_server", i)), "empo2_policy_server_generated_tokens_total") > 0
        ), f"server {i} got no traffic"
    per_actor = [
        total(scrape("127.0.0.1", PORTS.port("env_actor", j)), "empo2_env_actor_episodes_total") for j in range(3)
    ]
    assert all(n > 0 for n in per_actor), per_actor
    assert accepted >= finished  # nothing an actor counted as delivered is missing

    for a in actors:
        a.stop()
    replayed = ReplayBuffer(
        ReplayBufferConfig(group_size=2, variations_per_task=2), {"find-living-thing": [0, 1]}, seed=0
    )
    BufferLog.replay(tmp_path / "buffer.log", replayed)
    assert len(replayed.episode_ids) >= accepted  # and every accepted episode is in the log
