"""GiGPO: discounted returns, anchor-state grouping and the combined advantage, by hand."""

from __future__ import annotations

import numpy as np

from learner.advantages import CountBonus, anchor_step_advantages, discounted_returns
from learner.samples import GiGPO, group_turn_advantages
from protocol.messages import ON_POLICY, ON_POLICY_TIPS, Trajectory
from testing.factories import plain_turns, trajectory


def _traj(observations, score, mode=ON_POLICY, num_memories=None) -> Trajectory:
    n = len(observations)
    return trajectory(
        plain_turns(n),
        mode=mode,
        score=score,
        episode_id=f"e{score}{n}",
        task="t",
        num_memories=num_memories,
        observations=observations,
    )


A = _traj(["s0", "s1"], 100.0)  # succeeds
B = _traj(["s0", "s2", "s3"], 0.0)  # fails; shares only the first state with A


def _count(traj: Trajectory) -> np.ndarray:
    (intrinsic,) = CountBonus(1.0)([traj])
    return intrinsic


def test_discounted_returns_pay_the_score_at_the_last_step():
    np.testing.assert_allclose(discounted_returns(A, 0.01, _count(A), 0.95), [0.95, 1.0])  # 1.0 at t=1, 0.95*1 at t=0
    np.testing.assert_allclose(discounted_returns(B, 0.01, _count(B), 0.95), [0.0, 0.0, 0.0])


def test_discounted_returns_add_intrinsic_reward_each_step_in_tip_modes():
    t = _traj(["x", "y"], 0.0, mode=ON_POLICY_TIPS, num_memories=[0, 1])  # r_int = [1, 0.5]
    np.testing.assert_allclose(discounted_returns(t, 0.01, _count(t), 0.5), [1 + 0.5 * 0.5, 0.5])


def test_anchor_groups_normalise_identical_states_only():
    returns = [np.array([0.95, 1.0]), np.zeros(3)]
    std = anchor_step_advantages([A, B], returns, "std", 1e-9)
    # anchor "s0": values [0.95, 0] -> mean 0.475, std (Bessel) sqrt(2 * 0.475^2 / 1) = 0.475 sqrt(2)
    # -> +-1/sqrt(2) = +-0.7071068; every other state is alone -> 0
    np.testing.assert_allclose(std[0], [0.7071068, 0.0], atol=1e-6)
    np.testing.assert_allclose(std[1], [-0.7071068, 0.0, 0.0], atol=1e-6)
    mean_only = anchor_step_advantages([A, B], returns, "mean", 1e-9)
    np.testing.assert_allclose(mean_only[0], [0.475, 0.0])
    np.testing.assert_allclose(mean_only[1], [-0.475, 0.0, 0.0])


def test_gigpo_adds_the_weighted_step_advantage_to_grpo():
    grpo = group_turn_advantages([A, B], 0.01, CountBonus(1.0)([A, B]), 1e-9)
    # turn rewards A: [1, 1], B: [0, 0, 0] -> pooled mean 0.4, std (Bessel) sqrt((2 * 0.36 + 3 * 0.16) / 4)
    # = sqrt(0.3) = 0.5477226: A 0.6 / 0.5477226 = 1.095445, B -0.4 / 0.5477226 = -0.730297
    np.testing.assert_allclose(grpo[0], [1.095445, 1.095445], atol=1e-5)
    np.testing.assert_allclose(grpo[1], [-0.730297] * 3, atol=1e-5)
    gigpo = group_turn_advantages(
        [A, B], 0.01, CountBonus(1.0)([A, B]), 1e-9, GiGPO(gamma=0.95, step_weight=0.5, norm="std")
    )
    # the anchor "s0" step advantages +-0.7071068 (above), weighted by 0.5
    np.testing.assert_allclose(gigpo[0], [1.095445 + 0.5 * 0.7071068, 1.095445], atol=1e-5)
    np.testing.assert_allclose(gigpo[1], [-0.730297 - 0.5 * 0.7071068, -0.730297, -0.730297], atol=1e-5)
