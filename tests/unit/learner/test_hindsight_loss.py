"""HeRL's reward and loss by hand: the improvement bonus, and the hindsight-token loss
−A·ρ/(ρ+γ), never clipped, whose gradient is ργ/(ρ+γ)² of an ordinary token's."""

from __future__ import annotations

import pytest
import torch

from learner.advantages import improvement_bonus
from learner.loss import ClipConfig, clipped_policy_loss, hindsight_policy_loss


def test_the_bonus_moves_the_reward_by_alpha_of_the_gap_either_way():
    assert improvement_bonus(40.0, 90.0, 0.05) == pytest.approx(42.5)
    assert improvement_bonus(40.0, 20.0, 0.05) == pytest.approx(39.0)


def test_hindsight_tokens_weigh_rho_over_rho_plus_gamma_unclipped():
    old = torch.zeros(3)
    logp = torch.log(torch.tensor([1.0, 3.0, 0.2])).requires_grad_()  # ρ = 1, 3 and 0.2
    advantages = torch.tensor([2.0, 2.0, 2.0])
    loss = hindsight_policy_loss(logp, old, advantages, gamma=1.0)
    assert loss.tolist() == pytest.approx([-2 * 0.5, -2 * 0.75, -2 * 0.2 / 1.2])  # w = ρ/(ρ+γ): ρ = 3 not clipped
    loss.sum().backward()
    # dL/dlogp = −A·ργ/(ρ+γ)²: at ρ = 1, γ = 1 a quarter of an ordinary token's −A·ρ
    assert logp.grad.tolist() == pytest.approx([-2 * 0.25, -2 * 3 / 16, -2 * 0.2 / 1.44])
    ordinary = torch.zeros(1, requires_grad=True)
    plain, _ = clipped_policy_loss(ordinary, torch.zeros(1), torch.tensor([2.0]), ClipConfig(0.2, 0.3, 10.0))
    plain.sum().backward()
    assert logp.grad[0] / ordinary.grad[0] == pytest.approx(0.25)
    at_gamma_01 = hindsight_policy_loss(torch.zeros(1), torch.zeros(1), torch.tensor([1.0]), gamma=0.1)
    assert at_gamma_01.item() == pytest.approx(-1 / 1.1)
