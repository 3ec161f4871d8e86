"""How much the memory engaged per learner step (learner/memory_use.py), on hand-built groups."""

from __future__ import annotations

import pytest

from learner.memory_use import memory_stats
from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS
from testing.factories import Turn, trajectory


def _turns(tipped: list[bool]) -> list[Turn]:
    """Turns whose prompt holds a tip block (span (1, 2)) where `tipped` says so."""
    return [Turn(prompt=[1, 2, 3], response=[4], tip_spans=[(1, 2)] if t else ()) for t in tipped]


def test_tip_turns_retrievals_and_the_spread_of_r_int_by_hand():
    batch = [
        # a tip-mode group: episode a retrieved n = 0, 2 (tips from turn 1 on), episode b n = 2, 2
        trajectory(_turns([False, True]), mode=OFF_POLICY, group_id="tips", slot=0, num_memories=[0, 2]),
        trajectory(_turns([True, True]), mode=OFF_POLICY, group_id="tips", slot=1, num_memories=[2, 2]),
        # an on-policy group: no tips, no retrieval
        trajectory(_turns([False, False, False]), mode=ON_POLICY, group_id="plain", slot=0),
        trajectory(_turns([False]), mode=ON_POLICY, group_id="plain", slot=1),
    ]
    stats = memory_stats(batch)
    assert stats["tip_turn_fraction"] == pytest.approx(3 / 8)
    assert stats["tip_turn_fraction_by_mode"] == {OFF_POLICY: 0.75, ON_POLICY: 0.0}
    assert stats["retrieval_hit_fraction"] == pytest.approx(3 / 4)
    assert stats["retrieval_hits_mean"] == pytest.approx(6 / 4)
    # r_int = 1/(n+1) over the tip group's turns: 1, 1/3, 1/3, 1/3
    values = [1.0, 1 / 3, 1 / 3, 1 / 3]
    mean = sum(values) / 4
    std = (sum((v - mean) ** 2 for v in values) / 4) ** 0.5
    assert stats["r_int_spread_mean"] == pytest.approx(std) and std > 0
    assert stats["r_int_varies_fraction"] == 1.0


def test_a_saturated_memory_gives_r_int_no_spread():
    # every turn retrieved top_k = 10: r_int is 1/11 on every turn and cancels in the group's advantage
    batch = [
        trajectory(_turns([True, True]), mode=ON_POLICY_TIPS, group_id="g", slot=i, num_memories=[10, 10])
        for i in range(2)
    ]
    stats = memory_stats(batch)
    assert stats["r_int_spread_mean"] == 0.0 and stats["r_int_varies_fraction"] == 0.0
    assert stats["tip_turn_fraction"] == 1.0 and stats["retrieval_hits_mean"] == 10


def test_a_batch_without_tip_modes_reports_none():
    stats = memory_stats([trajectory(_turns([False, False]), mode=ON_POLICY)])
    assert stats["tip_turn_fraction"] == 0.0
    for key in ("retrieval_hit_fraction", "retrieval_hits_mean", "r_int_spread_mean", "r_int_varies_fraction"):
        assert stats[key] is None
