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


def test_a_server_behind_the_newest_version_is_passed_over_while_a_current_one_is_up(monkeypatch):
    """learner.background_push: a server whose push is still under way answers with an older version;
    requests go to the current ones until it answers with the newest, or retry_after_s has passed (its
    next answer then says where it is)."""
    clock = [100.0]
    monkeypatch.setattr("actors.env_actor.worker.time.monotonic", lambda: clock[0])
    chooser = ServerChooser(3, "round_robin", retry_after_s=30.0)
    for index, version in ((0, 5), (1, 4), (2, 5)):
        chooser.answered(index, version)
    assert {chooser.acquire() for _ in range(6)} == {0, 2}  # server 1 serves v4: passed over
    chooser.down_until[0] = chooser.down_until[2] = clock[0] + 10  # the current ones time out: 1 is used
    assert {chooser.acquire() for _ in range(3)} == {1}
    chooser.down_until[0] = chooser.down_until[2] = 0.0
    clock[0] += 31  # its version is old news: tried again
    assert 1 in {chooser.acquire() for _ in range(3)}
    chooser.answered(1, 5)  # caught up
    assert {chooser.acquire() for _ in range(6)} == {0, 1, 2}
