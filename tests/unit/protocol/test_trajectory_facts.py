"""Trajectory's environment facts (issue 22, item 6): the room and inventory after each turn's action,
the inventory at reset and the goal progress at the end survive the wire, are refused when too long or
not one per turn, and a record written before them decodes with them empty."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from protocol import decode, encode
from protocol.codec import ProtocolError
from protocol.messages import (
    MAX_GOAL_PROGRESS_CHARS,
    MAX_INVENTORY_CHARS,
    MAX_LOCATION_CHARS,
    ON_POLICY,
    Trajectory,
    TurnRecord,
)

INVENTORY = "In your inventory, you see:\n\tan orange"
GOAL = "Sequential Subgoals:\n0\ttrue\tGoalFocusOnLivingThing\tfocus on a living thing\n1\tfalse\t..."


def _turn(observation: str, action: str, location: str, inventory: str) -> TurnRecord:
    ids = np.array([1, 2])
    return TurnRecord(ids, ids, np.array([-0.5, -0.5]), observation, action, location=location, inventory=inventory)


def _traj(**episode) -> Trajectory:
    turns = [
        _turn("hallway look", "go to kitchen", "kitchen", INVENTORY),
        _turn("kitchen look", "pick up apple", "kitchen", INVENTORY + "\n\tan apple"),
    ]
    fields = dict(episode_id="e", group_id="g", slot=0, actor_id="a", task="boil", variation=1, mode=ON_POLICY)
    return Trajectory.from_turns(turns, **fields, score=10.0, done=False, **episode)


def _reject(t: Trajectory) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(encode(t))
    return info.value


def test_the_facts_round_trip():
    t = _traj(start_inventory=INVENTORY, goal_progress=GOAL)
    out = decode(encode(t))
    assert out.locations == ["kitchen", "kitchen"]
    assert out.inventories == [INVENTORY, INVENTORY + "\n\tan apple"]
    assert out.start_inventory == INVENTORY and out.goal_progress == GOAL


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"locations": ["kitchen", "x" * (MAX_LOCATION_CHARS + 1)]}, "a location is longer"),
        ({"inventories": ["", "x" * (MAX_INVENTORY_CHARS + 1)]}, "an inventory is longer"),
        ({"start_inventory": "x" * (MAX_INVENTORY_CHARS + 1)}, "an inventory is longer"),
        ({"goal_progress": "x" * (MAX_GOAL_PROGRESS_CHARS + 1)}, "the goal progress is longer"),
        ({"locations": ["kitchen"]}, "one per turn"),
        ({"inventories": ["", "", ""]}, "one per turn"),
    ],
)
def test_too_long_or_not_one_per_turn_is_refused(change, fragment):
    t = _traj()
    for name, value in change.items():
        setattr(t, name, value)
    err = _reject(t)
    assert err.reason == "invalid" and fragment in str(err)


def test_facts_at_their_bounds_are_accepted():
    t = _traj(start_inventory="x" * MAX_INVENTORY_CHARS, goal_progress="x" * MAX_GOAL_PROGRESS_CHARS)
    t.locations = ["x" * MAX_LOCATION_CHARS] * 2
    assert decode(encode(t)).locations == t.locations


def test_a_record_written_before_the_facts_decodes_with_them_empty():
    frames = encode(_traj(start_inventory=INVENTORY, goal_progress=GOAL))
    header = msgpack.unpackb(bytes(frames[1]), raw=False)
    for name in ("locations", "inventories", "start_inventory", "goal_progress"):
        del header["body"][name]
    out = decode([bytes(frames[0]), msgpack.packb(header, use_bin_type=True), *[bytes(f) for f in frames[2:]]])
    assert out.locations == ["", ""] and out.inventories == ["", ""]
    assert out.start_inventory == "" and out.goal_progress == ""
    assert out.observations == ["hallway look", "kitchen look"]  # the rest as it was
