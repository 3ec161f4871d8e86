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


def test_a_hindsight_sample_in_the_step_gets_a_quarter_of_an_ordinary_samples_gradient():
    """micro_batch_loss on one sample whose behaviour log-probs are the model's own (ρ = 1): as a
    hindsight sample its loss is −A/2 per token and its gradient a quarter of the ordinary one (γ = 1);
    without herl.gamma a hindsight sample is refused, not trained as an ordinary one."""
    import dataclasses

    import numpy as np

    from learner.config import LearnerConfig
    from learner.policy_model import response_logprobs
    from learner.samples import TurnSample
    from learner.step import PreScores, micro_batch_loss
    from protocol.messages import GUIDED
    from testing.factories import tiny_llama

    model = tiny_llama(40, seed=3, initializer_range=0.2)
    prompt, response = np.array([1, 2, 3, 4], np.int32), np.array([5, 6, 7], np.int32)
    with torch.no_grad():
        behaviour = response_logprobs(
            model, torch.from_numpy(prompt.astype(np.int64)), torch.from_numpy(response.astype(np.int64))
        )
    sample = TurnSample(prompt, prompt, response, behaviour.numpy(), 2.0, GUIDED, 0, False)
    cfg = LearnerConfig(low_prob_mask="off")

    def loss_and_grad(s: TurnSample):
        model.zero_grad()
        loss, _ = micro_batch_loss(model, [s], PreScores([None], None), cfg, version=0, hindsight_gamma=1.0)
        loss.sum().backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    ordinary_loss, ordinary_grad = loss_and_grad(sample)
    hindsight_loss, hindsight_grad = loss_and_grad(dataclasses.replace(sample, hindsight=True))
    assert ordinary_loss.tolist() == pytest.approx([-2.0] * 3, abs=1e-4)
    assert hindsight_loss.tolist() == pytest.approx([-1.0] * 3, abs=1e-4)
    torch.testing.assert_close(hindsight_grad, 0.25 * ordinary_grad, atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="hindsight_gamma"):
        micro_batch_loss(model, [dataclasses.replace(sample, hindsight=True)], PreScores([None], None), cfg, version=0)


@pytest.mark.parametrize("strip", [False, True])
def test_a_guided_episode_trains_with_or_without_its_guidance_and_the_bonus_moves_the_reward(strip):
    import numpy as np

    from learner.samples import build_samples
    from protocol.messages import GUIDED, ON_POLICY
    from testing.factories import Turn, trajectory

    guided = trajectory([Turn([1, 2, 3, 4, 5], [9], tip_spans=[(1, 3)])], mode=GUIDED, score=60.0, slot=0)
    guided.hindsight = True
    member = trajectory([Turn([1, 4, 5], [8])], mode=ON_POLICY, score=40.0, slot=1, episode_id="m")
    member.score_bonus = 1.0  # 0.05 × (60 − 40)

    def zero(trajs):
        return [np.zeros(t.num_turns) for t in trajs]

    samples = build_samples([guided, member], 1.0, zero, 1e-6, strip_guidance=strip)
    assert samples[0].hindsight and samples[0].guidance_stripped == strip
    assert samples[0].update_prompt.tolist() == ([1, 4, 5] if strip else [1, 2, 3, 4, 5])
    assert samples[0].update_is_behaviour_prompt == (not strip)
    # rewards 60 and 40 + 1: the advantage of each is ±(60 − 41) / std, the bonus counted
    assert samples[0].advantage == pytest.approx(-samples[1].advantage)
    assert samples[0].advantage == pytest.approx((60 - 41) / 2 / np.std([60, 41], ddof=1), rel=1e-4)
