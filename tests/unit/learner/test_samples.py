"""From trajectories to per-turn training samples (learner/samples.py)."""

from __future__ import annotations

import numpy as np
import pytest

from learner.advantages import CountBonus
from learner.samples import TurnSample, build_samples, remove_spans
from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS
from testing.factories import Turn, trajectory


def _traj(group_id, mode, score, turns, slot=0, versions=None, num_memories=None):
    """turns: list of (prompt ids, tip spans [(start, end)], response ids, behaviour logprobs)."""
    return trajectory(
        [Turn(prompt=p, response=r, logprobs=lp, tip_spans=spans) for p, spans, r, lp in turns],
        mode=mode,
        score=score,
        group_id=group_id,
        slot=slot,
        versions=versions,
        num_memories=num_memories,
    )


# ------------------------------------------------------------------------- remove_spans


def test_remove_spans_concrete():
    prompt = np.array([10, 11, 12, 13, 14, 15, 16, 17], dtype=np.int32)
    out = remove_spans(prompt, [(2, 4), (6, 7)])
    np.testing.assert_array_equal(out, [10, 11, 14, 15, 17])
    assert out.dtype == np.int32


def test_remove_spans_no_spans_is_identity():
    prompt = np.array([3, 1, 2], dtype=np.int32)
    np.testing.assert_array_equal(remove_spans(prompt, []), [3, 1, 2])


def test_remove_spans_at_edges_and_whole():
    prompt = np.array([1, 2, 3, 4], dtype=np.int32)
    np.testing.assert_array_equal(remove_spans(prompt, [(0, 1), (3, 4)]), [2, 3])
    assert remove_spans(prompt, [(0, 4)]).size == 0


def test_remove_spans_does_not_modify_input():
    prompt = np.array([1, 2, 3, 4], dtype=np.int32)
    remove_spans(prompt, [(1, 3)])
    np.testing.assert_array_equal(prompt, [1, 2, 3, 4])


# ------------------------------------------------------------------------ build_samples


def _off_policy_traj(group_id="g", score=100.0, slot=0):
    # turn 0: tip block [40, 41] at positions 3..5 ; turn 1: tip block [42, 43, 44] at 5..8
    return _traj(
        group_id,
        OFF_POLICY,
        score,
        [
            ([1, 2, 3, 40, 41, 4], [(3, 5)], [7, 8], [-0.5, -0.25]),
            ([1, 2, 3, 4, 5, 42, 43, 44], [(5, 8)], [9], [-1.5]),
        ],
        slot=slot,
        versions=[3, 4],
        num_memories=[2, 3],
    )


def test_one_sample_per_turn_with_its_response_and_behaviour():
    samples = build_samples([_off_policy_traj()], score_scale=0.01, intrinsic=CountBonus(1.0), eps=1e-6)
    assert len(samples) == 2
    assert all(isinstance(s, TurnSample) for s in samples)
    np.testing.assert_array_equal(samples[0].response, [7, 8])
    np.testing.assert_array_equal(samples[1].response, [9])
    np.testing.assert_allclose(samples[0].behaviour_logp, [-0.5, -0.25])
    np.testing.assert_allclose(samples[1].behaviour_logp, [-1.5])
    assert [s.policy_version for s in samples] == [3, 4]
    assert [s.mode for s in samples] == [OFF_POLICY, OFF_POLICY]


def test_off_policy_update_prompt_has_tips_removed():
    s0, s1 = build_samples([_off_policy_traj()], score_scale=0.01, intrinsic=CountBonus(1.0), eps=1e-6)
    np.testing.assert_array_equal(s0.update_prompt, [1, 2, 3, 4])
    np.testing.assert_array_equal(s0.tipfree_prompt, [1, 2, 3, 4])
    np.testing.assert_array_equal(s1.update_prompt, [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(s1.tipfree_prompt, [1, 2, 3, 4, 5])
    assert s0.with_tips and s1.with_tips
    assert not s0.update_is_behaviour_prompt and not s1.update_is_behaviour_prompt


def test_on_policy_tips_keeps_tips_in_update_prompt():
    traj = _traj("g", ON_POLICY_TIPS, 50.0, [([1, 2, 40, 41, 3], [(2, 4)], [7], [-0.1])])
    (s,) = build_samples([traj], score_scale=0.01, intrinsic=CountBonus(1.0), eps=1e-6)
    np.testing.assert_array_equal(s.update_prompt, [1, 2, 40, 41, 3])
    np.testing.assert_array_equal(s.tipfree_prompt, [1, 2, 3])
    assert s.with_tips
    assert s.update_is_behaviour_prompt


def test_on_policy_has_no_spans_and_identical_prompts():
    traj = _traj("g", ON_POLICY, 50.0, [([1, 2, 3], [], [7, 8], [-0.1, -0.2]), ([1, 2, 3, 4], [], [9], [-0.3])])
    samples = build_samples([traj], score_scale=0.01, intrinsic=CountBonus(1.0), eps=1e-6)
    assert len(samples) == 2
    for s, prompt in zip(samples, ([1, 2, 3], [1, 2, 3, 4])):
        np.testing.assert_array_equal(s.update_prompt, prompt)
        np.testing.assert_array_equal(s.tipfree_prompt, prompt)
        assert not s.with_tips
        assert s.update_is_behaviour_prompt


def test_tip_mode_turn_without_retrieved_tips_has_with_tips_false():
    # turn 1: retrieval returned nothing, so no span
    traj = _traj(
        "g",
        ON_POLICY_TIPS,
        0.0,
        [
            ([1, 2, 40, 3], [(2, 3)], [7], [-0.1]),
            ([1, 2, 3, 4], [], [8], [-0.2]),
        ],
        num_memories=[1, 0],
    )
    s0, s1 = build_samples([traj], score_scale=0.01, intrinsic=CountBonus(1.0), eps=1e-6)
    assert s0.with_tips is True
    assert s1.with_tips is False
    np.testing.assert_array_equal(s1.update_prompt, [1, 2, 3, 4])
    np.testing.assert_array_equal(s1.tipfree_prompt, [1, 2, 3, 4])


def test_off_policy_turn_without_tips_is_behaviour_prompt():
    traj = _traj("g", OFF_POLICY, 0.0, [([1, 2, 3], [], [7], [-0.1])])
    (s,) = build_samples([traj], score_scale=0.01, intrinsic=CountBonus(1.0), eps=1e-6)
    assert s.with_tips is False
    assert s.update_is_behaviour_prompt is True
    np.testing.assert_array_equal(s.update_prompt, [1, 2, 3])


def _sample(mode, with_tips):
    z = np.zeros(1, dtype=np.int32)
    return TurnSample(z, z, z, np.zeros(1, dtype=np.float32), 0.0, mode, 0, with_tips)


@pytest.mark.parametrize(
    "mode, with_tips, expected",
    [
        (ON_POLICY, False, True),
        (ON_POLICY_TIPS, True, True),
        (ON_POLICY_TIPS, False, True),
        (OFF_POLICY, True, False),
        (OFF_POLICY, False, True),
    ],
)
def test_update_is_behaviour_prompt(mode, with_tips, expected):
    assert _sample(mode, with_tips).update_is_behaviour_prompt is expected


def test_advantages_normalised_within_each_group_separately():
    # group A (on-policy): scores 100 and 0, one turn each -> rewards [1.0], [0.0]
    #   mean 0.5, std (Bessel) sqrt((0.25 + 0.25) / 1) = 0.7071068 -> advantages +-0.7071068 (eps 0)
    # group B (on-policy): scores 30, 30, 90 -> rewards 0.3, 0.3, 0.9
    #   mean 0.5, var = (0.04 + 0.04 + 0.16) / (3 - 1) = 0.12, std = 0.3464102
    #   (0.3 - 0.5) / 0.3464102 = -0.5773503 ; (0.9 - 0.5) / 0.3464102 = 1.1547005
    # pooled over both groups the values would differ (mean 0.5, std sqrt(0.74 / 4) = 0.4301163)
    trajs = [
        _traj("A", ON_POLICY, 100.0, [([1, 2], [], [10], [-0.1])], slot=0),
        _traj("B", ON_POLICY, 30.0, [([1, 2], [], [20], [-0.1])], slot=0),
        _traj("A", ON_POLICY, 0.0, [([1, 2], [], [11], [-0.1])], slot=1),
        _traj("B", ON_POLICY, 30.0, [([1, 2], [], [21], [-0.1])], slot=1),
        _traj("B", ON_POLICY, 90.0, [([1, 2], [], [22], [-0.1])], slot=2),
    ]
    samples = build_samples(trajs, score_scale=0.01, intrinsic=CountBonus(1.0), eps=0.0)
    assert len(samples) == 5
    by_response = {int(s.response[0]): s.advantage for s in samples}
    assert by_response[10] == pytest.approx(0.7071068, abs=1e-6)
    assert by_response[11] == pytest.approx(-0.7071068, abs=1e-6)
    assert by_response[20] == pytest.approx(-0.5773503, abs=1e-6)
    assert by_response[21] == pytest.approx(-0.5773503, abs=1e-6)
    assert by_response[22] == pytest.approx(1.1547005, abs=1e-6)
    assert all(isinstance(s.advantage, float) for s in samples)


def test_advantages_include_intrinsic_reward_per_turn():
    # off-policy group of one episode with two turns: score 0, n = [0, 1] -> rewards [1.0, 0.5]
    # mean 0.75, std (Bessel) sqrt(2 * 0.0625 / 1) = 0.3535534 -> advantages [+0.7071068, -0.7071068]
    traj = _traj(
        "g",
        OFF_POLICY,
        0.0,
        [
            ([1, 40, 2], [(1, 2)], [7], [-0.1]),
            ([1, 2, 41], [(2, 3)], [8], [-0.1]),
        ],
        num_memories=[0, 1],
    )
    s0, s1 = build_samples([traj], score_scale=0.01, intrinsic=CountBonus(1.0), eps=0.0)
    assert s0.advantage == pytest.approx(0.7071068, abs=1e-6)
    assert s1.advantage == pytest.approx(-0.7071068, abs=1e-6)


def test_mixed_mode_batch_sample_count_and_prompts():
    trajs = [
        _off_policy_traj("g1", 100.0, 0),
        _off_policy_traj("g1", 0.0, 1),
        _traj("g2", ON_POLICY, 10.0, [([5, 6], [], [7], [-0.2])]),
    ]
    samples = build_samples(trajs, score_scale=0.01, intrinsic=CountBonus(1.0), eps=1e-6)
    assert len(samples) == 2 + 2 + 1
    on = [s for s in samples if s.mode == ON_POLICY]
    assert len(on) == 1 and on[0].advantage == 0.0  # a group of one turn: zero advantage
    off = [s for s in samples if s.mode == OFF_POLICY]
    assert all(40 not in s.update_prompt and 42 not in s.update_prompt for s in off)
