"""Decoupled PPO (for stale samples): the ratio is taken against the proximal policy and the
loss weighted by the capped proximal/behaviour ratio, by hand on tiny tensors."""

from __future__ import annotations

import math

import torch

from learner.loss import ClipConfig, clipped_policy_loss

CLIP = ClipConfig(0.2, 0.3, 10.0)


def test_weight_is_proximal_over_behaviour_and_ratio_is_against_proximal():
    logp = torch.tensor([math.log(0.5)], requires_grad=True)
    proximal = torch.tensor([math.log(0.5)])
    behaviour = torch.tensor([math.log(0.25)])  # stale behaviour: w = 0.5 / 0.25 = 2
    loss, diag = clipped_policy_loss(logp, behaviour, torch.tensor([1.0]), CLIP, proximal, behaviour_weight_cap=5.0)
    # r = 0.5/0.5 = 1 (inside the clip), L = -A * r * w = -1 * 1 * 2 = -2
    assert torch.allclose(loss, torch.tensor([-2.0]))
    assert torch.allclose(diag["ratio"], torch.tensor([1.0])) and torch.allclose(
        diag["behaviour_weight"], torch.tensor([2.0])
    )
    loss.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([-2.0]))  # dL/dlogp = -A * r * w


def test_plain_ratio_would_have_been_clipped_where_decoupled_is_not():
    logp = torch.tensor([math.log(0.5)])
    behaviour = torch.tensor([math.log(0.25)])
    plain, plain_diag = clipped_policy_loss(logp, behaviour, torch.tensor([1.0]), CLIP)
    assert torch.allclose(plain, torch.tensor([-1.3])) and bool(plain_diag["clipped"][0])  # r = 2 clipped to 1.3
    decoupled, diag = clipped_policy_loss(logp, behaviour, torch.tensor([1.0]), CLIP, logp.clone(), 5.0)
    assert not bool(diag["clipped"][0]) and torch.allclose(decoupled, torch.tensor([-2.0]))


def test_tokens_over_the_weight_cap_are_dropped():
    logp = torch.log(torch.tensor([0.5, 0.5]))
    behaviour = torch.log(torch.tensor([0.05, 0.4]))  # weights 10 (over the cap of 5) and 1.25
    loss, diag = clipped_policy_loss(
        logp, behaviour, torch.tensor([1.0, 1.0]), CLIP, logp.clone(), behaviour_weight_cap=5.0
    )
    assert torch.allclose(loss, torch.tensor([0.0, -1.25]))
    assert diag["behaviour_weight_capped"].tolist() == [True, False]


def test_plain_mode_has_unit_weights():
    logp = torch.log(torch.tensor([0.5, 0.2]))
    _, diag = clipped_policy_loss(logp, logp - 0.1, torch.tensor([1.0, -1.0]), CLIP)
    assert diag["behaviour_weight"].tolist() == [1.0, 1.0] and not diag["behaviour_weight_capped"].any()


def test_entropy_and_k3_kl_by_hand():
    from learner.loss import entropy, kl_k3

    uniform = torch.log(torch.full((1, 4), 0.25))
    assert torch.allclose(entropy(uniform), torch.tensor([math.log(4)]))
    # Δ = ref − θ = log(0.5) − log(0.25) = log 2: exp(Δ) − Δ − 1 = 2 − 0.693147 − 1
    assert torch.allclose(
        kl_k3(torch.log(torch.tensor([0.25])), torch.log(torch.tensor([0.5]))), torch.tensor([0.306853]), atol=1e-6
    )
    assert torch.allclose(kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0])), torch.tensor([0.0]))
