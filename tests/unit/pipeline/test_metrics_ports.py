"""Metrics ports: each role has its own range above metrics.base_port, so no count of servers,
actors or learner ranks within the documented maxima can collide; out of range is refused."""

from __future__ import annotations

import pytest

from common.config import METRICS_PORT_SPAN, METRICS_PORTS, ConfigError, MetricsConfig
from pipeline.config import load_config


def test_the_role_ranges_are_disjoint_and_inside_the_span():
    taken: dict[int, str] = {}
    for role, (first, count) in METRICS_PORTS.items():
        for offset in range(first, first + count):
            assert offset not in taken, f"{role} and {taken[offset]} share offset {offset}"
            assert 0 <= offset < METRICS_PORT_SPAN
            taken[offset] = role


def test_every_process_of_a_full_deployment_has_its_own_port():
    m = MetricsConfig()
    ports = [m.port("replay_buffer"), m.port("memory_service")]
    for role in ("policy_server", "learner", "env_actor"):
        ports += [m.port(role, i) for i in range(METRICS_PORTS[role][1])]
    assert len(ports) == len(set(ports))
    assert min(ports) == m.base_port and max(ports) < m.base_port + METRICS_PORT_SPAN


def test_the_collisions_of_the_old_layout_are_gone():
    m = MetricsConfig()
    assert m.port("learner", 8) != m.port("env_actor", 0)  # base+12+8 == base+20+0 before
    assert m.port("policy_server", 10) != m.port("replay_buffer")  # base+10 before


def test_the_documented_default_ports():
    m = MetricsConfig()
    assert [m.port("policy_server", 0), m.port("policy_server", 1)] == [9100, 9101]
    assert (m.port("replay_buffer"), m.port("memory_service")) == (9200, 9201)
    assert [m.port("learner", 0), m.port("learner", 1)] == [9300, 9301]
    assert [m.port("env_actor", 0), m.port("env_actor", 1)] == [9400, 9401]


@pytest.mark.parametrize("role, index", [("learner", 100), ("env_actor", 700), ("policy_server", 100), ("learner", -1)])
def test_an_index_past_its_range_has_no_port(role, index):
    with pytest.raises(ConfigError, match=f"at most {METRICS_PORTS[role][1]} {role}"):
        MetricsConfig().port(role, index)


def test_the_configured_counts_are_checked_at_load():
    servers = ",".join(f"tcp://127.0.0.1:{6000 + i}" for i in range(101))
    with pytest.raises(ConfigError) as err:
        load_config([f"endpoints.policy_servers=[{servers}]"])
    assert err.value.key == "endpoints.policy_servers" and "at most 100" in err.value.problem
    with pytest.raises(ConfigError) as err:
        load_config(["launch.num_env_actors=701"])
    assert err.value.key == "launch.num_env_actors"
    load_config([f"endpoints.policy_servers=[{servers.rsplit(',', 1)[0]}]", "launch.num_env_actors=700"])
