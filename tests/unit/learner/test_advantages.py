"""Per-turn rewards (extrinsic + intrinsic) and GRPO group advantages (learner/advantages.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from learner.advantages import TIP_MODES, CountBonus, group_advantages, turn_rewards
from learner.config import LearnerConfig
from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS, Trajectory
from testing.factories import plain_turns, trajectory


def _traj(mode: str, score: float, num_memories: list[int]) -> Trajectory:
    n = len(num_memories)
    return trajectory(
        plain_turns(n, logprob=-1.0),
        mode=mode,
        score=score,
        episode_id="e",
        num_memories=num_memories,
        observations=["obs"] * n,
    )


def _rewards(traj: Trajectory, score_scale: float, intrinsic_coef: float) -> np.ndarray:
    """Turn rewards with the paper's count bonus."""
    (intrinsic,) = CountBonus(intrinsic_coef)([traj])
    return turn_rewards(traj, score_scale, intrinsic)


def test_tip_modes_are_the_two_memory_modes():
    assert set(TIP_MODES) == {ON_POLICY_TIPS, OFF_POLICY}


def test_on_policy_reward_is_extrinsic_only_on_every_turn():
    r = _rewards(_traj(ON_POLICY, 80.0, [0, 1, 3]), 0.01, 1.0)
    # 80 * 0.01 = 0.8 on each of the 3 turns; no intrinsic reward (num_memories ignored)
    np.testing.assert_allclose(r, [0.8, 0.8, 0.8], atol=1e-12)
    assert r.dtype == np.float64


@pytest.mark.parametrize("mode", [ON_POLICY_TIPS, OFF_POLICY])
def test_tip_modes_add_intrinsic_reward(mode):
    r = _rewards(_traj(mode, 0.0, [0, 1, 3]), 0.01, 1.0)
    # 1/(0+1) = 1, 1/(1+1) = 0.5, 1/(3+1) = 0.25
    np.testing.assert_allclose(r, [1.0, 0.5, 0.25], atol=1e-12)


def test_intrinsic_plus_extrinsic_with_coefficient():
    r = _rewards(_traj(OFF_POLICY, 50.0, [0, 4, 10]), 0.01, 0.5)
    # 0.5 + 0.5/1 = 1.0 ; 0.5 + 0.5/5 = 0.6 ; 0.5 + 0.5/11 = 0.5454545...
    np.testing.assert_allclose(r, [1.0, 0.6, 0.5 + 0.5 / 11], atol=1e-12)


def test_intrinsic_coefficient_zero_disables_bonus():
    r = _rewards(_traj(ON_POLICY_TIPS, 100.0, [0, 2]), 0.01, 0.0)
    np.testing.assert_allclose(r, [1.0, 1.0], atol=1e-12)


def test_negative_score_failed_goal():
    r = _rewards(_traj(ON_POLICY, -100.0, [0, 0]), 0.01, 1.0)
    np.testing.assert_allclose(r, [-1.0, -1.0], atol=1e-12)


def test_default_scale_adds_the_intrinsic_reward_unscaled_to_the_0_100_score():
    """The reference's relative scale: score 0..100 as it is, plus r_int = coef / (n + 1) <= coef."""
    cfg = LearnerConfig()
    assert cfg.score_scale == 1.0 and cfg.intrinsic_coef == 1.0
    r = _rewards(_traj(ON_POLICY_TIPS, 50.0, [0, 1, 3]), cfg.score_scale, cfg.intrinsic_coef)
    # 50 + 1/1, 50 + 1/2, 50 + 1/4
    np.testing.assert_allclose(r, [51.0, 50.5, 50.25], atol=1e-12)
    # two episodes with equal scores: the bonus breaks the tie; a 10-point better score outweighs any bonus
    assert _rewards(_traj(OFF_POLICY, 60.0, [10]), 1.0, 1.0)[0] > _rewards(_traj(OFF_POLICY, 50.0, [0]), 1.0, 1.0)[0]


@pytest.mark.parametrize("mode", [ON_POLICY_TIPS, OFF_POLICY])
def test_a_failed_retrieval_gives_no_intrinsic_reward(mode):
    traj = _traj(mode, 20.0, [0, 0, 3])
    traj.memory_retrieved = np.array([1, 0, 1], np.uint8)  # turn 1: the memory service did not answer
    traj.validate()
    (intrinsic,) = CountBonus(1.0)([traj])
    # turn 0 answered with no memories: 1/(0+1) = 1; turn 1 failed: 0 (not 1); turn 2: 1/(3+1)
    np.testing.assert_allclose(intrinsic, [1.0, 0.0, 0.25], atol=1e-12)
    np.testing.assert_allclose(turn_rewards(traj, 1.0, intrinsic), [21.0, 20.0, 20.25], atol=1e-12)


def test_group_advantages_pooled_over_all_turns_of_the_group():
    adv = group_advantages([np.array([1.0, 1.0]), np.array([0.0])], eps=0.0)
    # pooled [1, 1, 0]: mean = 2/3, var = (1/9 + 1/9 + 4/9) / (3 - 1) = 1/3 (Bessel), std = 1/sqrt(3) = 0.5773503
    # (1 - 2/3) / (1/sqrt(3)) = sqrt(3)/3 = 0.5773503
    # (0 - 2/3) / (1/sqrt(3)) = -2 sqrt(3)/3 = -1.1547005
    assert len(adv) == 2
    np.testing.assert_allclose(adv[0], [0.5773503, 0.5773503], atol=1e-6)
    np.testing.assert_allclose(adv[1], [-1.1547005], atol=1e-6)


def test_group_advantages_eps_is_added_to_std():
    adv = group_advantages([np.array([2.0]), np.array([0.0])], eps=1.0)
    # mean 1, std sqrt((1 + 1) / (2 - 1)) = sqrt(2): (2 - 1) / (sqrt(2) + 1) = sqrt(2) - 1 = 0.4142136, and -0.4142136
    np.testing.assert_allclose(adv[0], [math.sqrt(2) - 1], atol=1e-12)
    np.testing.assert_allclose(adv[1], [1 - math.sqrt(2)], atol=1e-12)


def test_group_advantages_differs_from_per_episode_normalisation():
    # episode means are 1 and 0; per-turn pooling gives the turns of episode 0 different values
    adv = group_advantages([np.array([0.0, 2.0]), np.array([0.0])], eps=0.0)
    # pooled [0, 2, 0]: mean 2/3, var = (4/9 + 16/9 + 4/9) / (3 - 1) = 4/3, std = 2/sqrt(3) = 1.1547005
    # (0 - 2/3) / 1.1547005 = -0.5773503 ; (2 - 2/3) / 1.1547005 = 1.1547005
    np.testing.assert_allclose(adv[0], [-0.5773503, 1.1547005], atol=1e-6)
    np.testing.assert_allclose(adv[1], [-0.5773503], atol=1e-6)


def test_all_equal_rewards_give_zero_advantages():
    adv = group_advantages([np.array([0.5, 0.5]), np.array([0.5]), np.array([0.5, 0.5, 0.5])], eps=1e-6)
    for a in adv:
        assert np.all(np.isfinite(a))
        np.testing.assert_array_equal(a, np.zeros_like(a))


def test_single_member_group_with_one_turn_is_zero_and_finite():
    adv = group_advantages([np.array([3.0])], eps=1e-6)
    assert adv[0].tolist() == [0.0]


def test_advantages_have_zero_mean_unit_std_over_pooled_turns():
    rng = np.random.default_rng(0)
    rewards = [rng.normal(size=k) for k in (3, 5, 1, 4)]
    adv = group_advantages(rewards, eps=0.0)
    pooled = np.concatenate(adv)
    assert math.isclose(pooled.mean(), 0.0, abs_tol=1e-12)
    assert math.isclose(pooled.std(ddof=1), 1.0, rel_tol=1e-12)  # the sample std (Bessel) is 1
    assert [len(a) for a in adv] == [3, 5, 1, 4]


def test_group_advantages_are_torch_std_normalised_with_bessel():
    """A = (R - mean) / (torch.std(R) + eps): torch.std is unbiased (n - 1), as the reference's."""
    rng = np.random.default_rng(1)
    rewards = [rng.normal(50, 30, size=k) for k in (4, 2, 3)]
    eps = 1e-6
    pooled = torch.from_numpy(np.concatenate(rewards))
    expected = (pooled - pooled.mean()) / (torch.std(pooled) + eps)
    np.testing.assert_allclose(np.concatenate(group_advantages(rewards, eps)), expected.numpy(), rtol=1e-12)
    # and the population std would give another answer
    assert not np.allclose(np.concatenate(group_advantages(rewards, eps)), (pooled - pooled.mean()) / pooled.std(False))
