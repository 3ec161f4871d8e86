"""Request spreading over policy servers: least-loaded picks the idlest, ties rotate."""

from __future__ import annotations

import pytest

from actors.env_actor.worker import ServerChooser
from common.config import ConfigError
from pipeline.config import load_config


def test_least_loaded_prefers_the_server_with_fewest_requests_in_flight():
    chooser = ServerChooser(3, "least_loaded", 60.0)
    first, second, third = chooser.acquire(), chooser.acquire(), chooser.acquire()
    assert sorted([first, second, third]) == [0, 1, 2]  # one each before any doubles up
    chooser.release(second)
    assert chooser.acquire() == second  # the only server with nothing in flight
    assert chooser.in_flight == [1, 1, 1]


def test_round_robin_rotates_regardless_of_load():
    chooser = ServerChooser(2, "round_robin", 60.0)
    assert [chooser.acquire() for _ in range(4)] == [0, 1, 0, 1]
    assert chooser.in_flight == [2, 2]


def test_unknown_policy_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"env_actor\.server_selection.*least_loaded, round_robin"):
        load_config(["env_actor.server_selection=random"])


def test_a_timed_out_server_is_passed_over_until_its_retry_delay_passes(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("actors.env_actor.worker.time.monotonic", lambda: clock[0])
    for policy in ("least_loaded", "round_robin"):
        chooser = ServerChooser(3, policy, retry_after_s=30.0)

        def pick(chooser: ServerChooser = chooser) -> int:  # one request, answered
            index = chooser.acquire()
            chooser.release(index)
            return index

        chooser.mark_down(1)
        picks = [pick() for _ in range(6)]
        assert 1 not in picks and set(picks) == {0, 2}
        for i in (0, 2):
            chooser.mark_down(i)
        assert pick() in (0, 1, 2)  # every server down: try one anyway
        clock[0] += 31.0
        assert {pick() for _ in range(3)} == {0, 1, 2}
        clock[0] = 100.0
