"""Request spreading over policy servers: least-loaded picks the idlest, ties rotate."""

from __future__ import annotations

import pytest

from actors.env_actor import ServerChooser
from pipeline.config import ConfigError, load_config


def test_least_loaded_prefers_the_server_with_fewest_requests_in_flight():
    chooser = ServerChooser(3, "least_loaded")
    first, second, third = chooser.acquire(), chooser.acquire(), chooser.acquire()
    assert sorted([first, second, third]) == [0, 1, 2]  # one each before any doubles up
    chooser.release(second)
    assert chooser.acquire() == second  # the only server with nothing in flight
    assert chooser.in_flight == [1, 1, 1]


def test_round_robin_rotates_regardless_of_load():
    chooser = ServerChooser(2, "round_robin")
    assert [chooser.acquire() for _ in range(4)] == [0, 1, 0, 1]
    assert chooser.in_flight == [2, 2]


def test_unknown_policy_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"env_actor\.server_selection.*least_loaded, round_robin"):
        load_config(["env_actor.server_selection=random"])
