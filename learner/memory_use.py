"""How much EMPO2's memory engaged, per learner step, from the batch's trajectories (issue 37): the
figures that tell an EMPO2 run from GRPO in practice. Into the metrics log's "step" record and the
empo2_learner_<name> gauges (common/metrics.py):

    tip_turn_fraction          turns whose prompt showed at least one tip, over all the batch's turns
    tip_turn_fraction_by_mode  the same within each mode's turns (a dict; not a gauge)
    retrieval_hit_fraction     of the tip modes' turns whose retrieval answered, those given >= 1 memory
    retrieval_hits_mean        memories retrieved per such turn (n of the intrinsic reward 1/(n+1))
    r_int_spread_mean          mean over the batch's groups of a tip mode of the standard deviation of
                               r_int = 1/(n+1) over the group's turns: 0 when every turn retrieved
                               the same count, so the bonus cancels in the group's advantage
    r_int_varies_fraction      of those groups, the share whose r_int is not the same on every turn

None where the batch has no turn (or group) of a tip mode. The coefficient of r_int
(learner.intrinsic_coef) scales the spread; here it is 1. The tip turns that contributed gradient
are the learner's own count (StepStats.tip_samples_trained_fraction: after the low-probability mask).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from learner.advantages import CountBonus
from protocol.messages import TIP_MODES, Trajectory

UNIT_COUNT_BONUS = CountBonus(1.0)

METRICS = (
    "tip_turn_fraction",
    "retrieval_hit_fraction",
    "retrieval_hits_mean",
    "r_int_spread_mean",
    "r_int_varies_fraction",
)


def tip_turns(t: Trajectory) -> list[bool]:
    """Per turn: its prompt shows at least one tip (a turn keeps the tips of the turns before it)."""
    return [bool(t.turn_tip_spans(i)) for i in range(t.num_turns)]


def memory_stats(trajectories: Sequence[Trajectory]) -> dict:
    """METRICS and tip_turn_fraction_by_mode of a batch (complete groups, by group_id)."""
    shown = [tip_turns(t) for t in trajectories]
    turns = sum(t.num_turns for t in trajectories)
    by_mode: dict[str, list[int]] = {}
    for t, s in zip(trajectories, shown):
        tally = by_mode.setdefault(t.mode, [0, 0])
        tally[0] += sum(s)
        tally[1] += t.num_turns
    # n of each tip-mode turn whose retrieval answered (a failed one shows no tips and earns no bonus)
    retrieved = [
        int(n)
        for t in trajectories
        if t.mode in TIP_MODES
        for n, ok in zip(t.num_memories.tolist(), t.memory_retrieved.tolist())
        if ok
    ]
    # r_int of each tip-mode turn as the learner's count bonus computes it, at coefficient 1
    tipped = [t for t in trajectories if t.mode in TIP_MODES]
    groups: dict[str, list[float]] = {}
    for t, bonus in zip(tipped, UNIT_COUNT_BONUS(tipped)):
        groups.setdefault(t.group_id, []).extend(bonus.tolist())
    spreads = [statistics.pstdev(r) for r in groups.values() if r]
    return {
        "tip_turn_fraction": sum(map(sum, shown)) / turns if turns else None,
        "tip_turn_fraction_by_mode": {mode: tips / n for mode, (tips, n) in sorted(by_mode.items()) if n},
        "retrieval_hit_fraction": statistics.fmean(n > 0 for n in retrieved) if retrieved else None,
        "retrieval_hits_mean": statistics.fmean(retrieved) if retrieved else None,
        "r_int_spread_mean": statistics.fmean(spreads) if spreads else None,
        "r_int_varies_fraction": statistics.fmean(s > 0 for s in spreads) if spreads else None,
    }
