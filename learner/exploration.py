"""Exploration measured directly, per learner step (issue 22; the EMPO2 paper's Figure 3): how many
distinct states a batch's episodes reach and distinct actions they take, and whether the episodes
of a group collapse onto one path.

A state is where the agent chose an action: its room, its inventory and the objects it sees,
hashed (state_key). Turn i's state is read from the trajectory: the room and the visible objects
from observations[i] (every state shown to the policy holds ScienceWorld's look text:
common.scienceworld.room_of, visible_objects), the inventory from inventories[i-1], the inventory
after the previous action (start_inventory before turn 0). A trajectory recorded before the
inventories were (Trajectory derives them as "") hashes with an empty inventory.

Per learner step, into the metrics log's "step" record and the empo2_learner_<name> gauges:
    distinct_states_per_episode   mean over the batch's episodes of the distinct states each acted in
    distinct_states_per_group     mean over the batch's groups of the distinct states of all their
                                  episodes together
    distinct_actions_per_group    mean over the groups of the distinct actions their episodes executed
    collapsed_group_fraction      fraction of the groups of two or more episodes whose episodes all have
                                  the same state sequence (None: no such group)
SGE (actors/env_actor/strategy.py), None in a batch without strategies:
    strategies_per_episode        mean strategies an episode wrote
    distinct_strategies_per_group mean over the groups of their distinct strategy texts
and, beside the gauges, score_by_strategy_temperature: the batch's mean episode score per strategy
temperature (the spread of a group's members, sge.strategy_temperature_min..max).
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterable, Sequence

from common.scienceworld import room_of, visible_objects
from protocol.messages import Trajectory

METRICS = (
    "distinct_states_per_episode",
    "distinct_states_per_group",
    "distinct_actions_per_group",
    "collapsed_group_fraction",
    "strategies_per_episode",
    "distinct_strategies_per_group",
)


def state_key(room: str, inventory: str, objects: Iterable[str]) -> str:
    """A state's hash: its room, its inventory's lines and its objects, each set in sorted order."""
    items = sorted({line.strip() for line in inventory.splitlines()} - {""})
    text = "\x1e".join([room, "\x1f".join(items), "\x1f".join(sorted(objects))])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def episode_states(t: Trajectory) -> list[str]:
    """The state of each turn of an episode, where it chose the turn's action."""
    return [
        state_key(room_of(observation), inventory, visible_objects(observation))
        for observation, inventory in zip(t.observations, t.inventories_before())
    ]


def strategy_stats(trajectories: Sequence[Trajectory], groups: dict[str, list[int]]) -> dict:
    """SGE's part of exploration_stats."""
    written = [[s for s in t.strategies if s] for t in trajectories]
    if not any(written):
        return {
            "strategies_per_episode": None,
            "distinct_strategies_per_group": None,
            "score_by_strategy_temperature": {},
        }
    by_temperature: dict[str, list[float]] = {}
    for t in trajectories:
        if t.strategy_temperature:
            by_temperature.setdefault(f"{t.strategy_temperature:.2f}", []).append(t.score)
    return {
        "strategies_per_episode": statistics.fmean(map(len, written)),
        "distinct_strategies_per_group": statistics.fmean(
            len({s for i in members for s in written[i]}) for members in groups.values()
        ),
        "score_by_strategy_temperature": {k: statistics.fmean(v) for k, v in sorted(by_temperature.items())},
    }


def exploration_stats(trajectories: Sequence[Trajectory]) -> dict[str, float | None]:
    """METRICS of a batch of trajectories (complete groups, by group_id), and SGE's scores by strategy
    temperature; None for an empty batch."""
    if not trajectories:
        return {**dict.fromkeys(METRICS), "score_by_strategy_temperature": {}}
    states = [episode_states(t) for t in trajectories]
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajectories):
        groups.setdefault(t.group_id, []).append(i)
    several = [members for members in groups.values() if len(members) > 1]
    return {
        "distinct_states_per_episode": statistics.fmean(len(set(s)) for s in states),
        "distinct_states_per_group": statistics.fmean(
            len({s for i in members for s in states[i]}) for members in groups.values()
        ),
        "distinct_actions_per_group": statistics.fmean(
            len({a for i in members for a in trajectories[i].actions}) for members in groups.values()
        ),
        "collapsed_group_fraction": statistics.fmean(
            all(states[i] == states[members[0]] for i in members) for members in several
        )
        if several
        else None,
        **strategy_stats(trajectories, groups),
    }
