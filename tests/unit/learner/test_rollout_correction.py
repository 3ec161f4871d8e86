"""The rollout correction (learner.rollout_correction, learner/loss.py): ρ_t = π_old/π_behaviour, π_old the
learner's policy before the update, π_behaviour the servers' log-probs. By hand on tiny tensors: tis's
truncated weights, mis's dropped samples, token_mask's masked tokens, the mismatch metrics; then through
train_step with perturbed behaviour log-probs.

    tis         w_t = min(ρ_t, C)
    mis         w_t = 1[1/C ≤ Π_{t∈i} ρ_t ≤ C]     (the sample's product, not the geometric mean)
    token_mask  w_t = 1[low ≤ ρ_t ≤ high]
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from common.config import ConfigError
from learner.config import LearnerConfig
from learner.loss import rollout_correction, rollout_totals
from learner.samples import TurnSample
from learner.step import StepContext, train_step
from protocol.messages import ON_POLICY
from testing.factories import tiny_llama
from tests.helpers import logprobs


def _correct(ratios, mode, samples=None, cap=2.0, low=0.5, high=2.0):
    """w_t and the corrected tokens for the given ρ_t (π_behaviour's log-prob 0, π_old's log ρ_t)."""
    old = torch.tensor([math.log(r) for r in ratios])
    sample = torch.tensor(samples if samples is not None else [0] * len(ratios))
    return rollout_correction(old, torch.zeros_like(old), sample, mode, cap, low, high)


def test_none_weighs_every_token_one():
    weight, corrected = _correct([0.1, 1.0, 9.0], "none")
    assert weight.tolist() == [1.0, 1.0, 1.0] and corrected.tolist() == [False, False, False]


def test_tis_truncates_the_ratio_at_the_cap():
    # ρ = 1, 5, 1.25, 0.25 at C = 2: w = 1, 2 (truncated), 1.25, 0.25 (never raised)
    weight, corrected = _correct([1.0, 5.0, 1.25, 0.25], "tis")
    torch.testing.assert_close(weight, torch.tensor([1.0, 2.0, 1.25, 0.25]))
    assert corrected.tolist() == [False, True, False, False]
    assert not weight.requires_grad


def test_mis_drops_a_sample_whose_sequence_ratio_leaves_one_over_c_to_c():
    # sample 0: 2 · 2 = 4 > 2 (dropped, though each token's ρ is within C); sample 1: 2 · 0.5 = 1 (kept);
    # sample 2: 0.3 · 1.5 = 0.45 < 1/2 (dropped); sample 3: 1.5 · 1.2 = 1.8 (kept)
    weight, corrected = _correct([2.0, 2.0, 2.0, 0.5, 0.3, 1.5, 1.5, 1.2], "mis", samples=[0, 0, 1, 1, 2, 2, 3, 3])
    assert weight.tolist() == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert corrected.tolist() == [True, True, False, False, True, True, False, False]
    # the product, not the geometric mean: 1.9 ** 2 = 3.61 > 2 though each token's 1.9 is within [1/2, 2]
    weight, _ = _correct([1.9, 1.9, 1.9], "mis", samples=[0, 0, 1])
    assert weight.tolist() == [0.0, 0.0, 1.0]
    # a sample at the bounds stays: 1/C and C themselves are inside
    weight, _ = _correct([0.5, 2.0], "mis", samples=[0, 1])
    assert weight.tolist() == [1.0, 1.0]


def test_token_mask_gives_no_weight_outside_low_high():
    # ρ = 0.4 (below 0.5), 0.5 and 2 (the bounds, kept), 1, 2.5 (above 2)
    weight, corrected = _correct([0.4, 0.5, 1.0, 2.0, 2.5], "token_mask")
    assert weight.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert corrected.tolist() == [True, False, False, False, True]


def test_mismatch_totals_by_hand():
    # log ρ = 0.1, −0.2, 0.3, −0.4 on the judged tokens, and a HeRL token (log ρ = 3) that is not judged
    old = torch.tensor([0.1, -0.2, 0.3, -0.4, 3.0])
    behaviour = torch.zeros(5)
    weight = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0])
    corrected = torch.tensor([False, False, True, True, False])
    sample = torch.tensor([0, 0, 1, 1, 2])
    judged = torch.tensor([True, True, True, True, False])
    totals = rollout_totals(old, behaviour, weight, corrected, sample, judged)
    # k3 of KL(π_behaviour || π_old) on tokens sampled from π_behaviour: ρ − 1 − log ρ
    kl = sum(math.exp(d) - 1 - d for d in (0.1, -0.2, 0.3, -0.4))  # 0.005171 + 0.018731 + 0.049859 + 0.070320
    assert totals["rollout_kl"] == pytest.approx(kl, rel=1e-5) and kl == pytest.approx(0.144081, abs=1e-6)
    assert totals["rollout_tokens"] == 4 and totals["rollout_weight"] == 2.0
    assert totals["rollout_corrected"] == 2.0 and totals["rollout_corrected_samples"] == 1  # sample 1's two
    # |log ρ| = 0.1, 0.2, 0.3, 0.4: max 0.4; p50 between 0.2 and 0.3 = 0.25; p99 at 0.99 · 3 = 2.97: 0.3 + 0.97 · 0.1
    assert totals["rollout_logratio_max"] == pytest.approx(0.4)
    assert totals["rollout_logratio_p50"] == pytest.approx(0.25)
    assert totals["rollout_logratio_p99"] == pytest.approx(0.397)
    empty = rollout_totals(*(torch.zeros(0) for _ in range(3)), torch.zeros(0, dtype=torch.bool),
                           torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.bool))  # fmt: skip
    assert empty["rollout_tokens"] == 0 and empty["rollout_logratio_p99"] == 0.0


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(rollout_correction_cap=0.5), "rollout_correction_cap"),
        (dict(rollout_correction_low=0.0), "rollout_correction_low"),
        (dict(rollout_correction_low=1.5), "rollout_correction_low"),
        (dict(rollout_correction_high=0.9), "rollout_correction_high"),
    ],
)
def test_config_refuses(overrides, key):
    with pytest.raises(ConfigError, match=key):
        LearnerConfig(**overrides).validate()
    LearnerConfig(rollout_correction="mis").validate()  # the defaults with a correction are fine


# ------------------------------------------------ through train_step, on a tiny model

VOCAB = 64
PROMPT = np.array([1, 2, 3, 4, 5, 6], np.int32)
RESPONSES = ([7, 8], [9, 10, 11], [12, 13, 14, 15])
ADVANTAGES = (1.0, -0.5, 0.5)
# behaviour log-prob − the learner's, per token: ρ_t = exp(−δ_t)
#   sample 0: ρ = e ≈ 2.72 (over C and high), 1            Π = 2.72 > 2: mis drops it
#   sample 1: ρ = e⁻¹ ≈ 0.37 (below low), e^0.5 ≈ 1.65, 1   Π = e^-0.5 ≈ 0.61: kept
#   sample 2: ρ = e^-0.3 ≈ 0.74 each                        Π = e^-1.2 ≈ 0.30 < 1/2: mis drops it
DELTAS = ([-1.0, 0.0], [1.0, -0.5, 0.0], [0.3, 0.3, 0.3, 0.3])


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama(
        VOCAB, seed=7, hidden_size=16, num_attention_heads=2, intermediate_size=32, initializer_range=0.2
    ).eval()


def _samples(model, perturbed: bool) -> list[TurnSample]:
    out = []
    for response, advantage, delta in zip(RESPONSES, ADVANTAGES, DELTAS):
        response = np.array(response, np.int32)
        behaviour = logprobs(model, PROMPT, response) + (np.array(delta, np.float32) if perturbed else 0)
        out.append(TurnSample(PROMPT, PROMPT, response, behaviour, advantage, ON_POLICY, 0, False))
    return out


def _step(model, samples, mode, lr=0.0, mini_batch_samples=0):
    cfg = LearnerConfig(
        rollout_correction=mode, low_prob_mask="off", max_grad_norm=1e9, mini_batch_samples=mini_batch_samples
    )
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        return train_step(StepContext(model, torch.optim.SGD(model.parameters(), lr=lr), samples, cfg, 0, seed=0))
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(state[n])


def _expected(mode: str) -> float:
    """The token-mean loss by hand: the update pass's policy is π_old, so the ratio against π_old is 1 (inside
    the clip) and L_t = −A · w_t; none clips ρ_t itself (ε 0.2 / 0.3; no dual clip at these ratios)."""
    total, tokens = 0.0, 0
    for advantage, delta in zip(ADVANTAGES, DELTAS):
        rho = [math.exp(-d) for d in delta]
        product = math.prod(rho)
        for r in rho:
            if mode == "none":
                clipped = min(max(r, 0.8), 1.3)
                total += max(-advantage * r, -advantage * clipped)
            else:
                w = {"tis": min(r, 2.0), "mis": float(0.5 <= product <= 2.0), "token_mask": float(0.5 <= r <= 2.0)}
                total += -advantage * w[mode]
            tokens += 1
    return total / tokens


@pytest.mark.parametrize("mode", ["none", "tis", "mis", "token_mask"])
def test_exact_behaviour_log_probs_leave_every_mode_the_plain_loss(model, mode):
    samples = _samples(model, perturbed=False)
    stats = _step(model, samples, mode)
    plain = -sum(a * len(r) for a, r in zip(ADVANTAGES, RESPONSES)) / 9  # ρ = 1 everywhere: L_t = −A
    assert stats.loss == pytest.approx(plain, abs=1e-5)
    assert stats.rollout_corrected_fraction == 0.0 and stats.rollout_weight_mean == pytest.approx(1.0, abs=1e-5)
    assert stats.rollout_kl_mean == pytest.approx(0.0, abs=1e-6) and stats.rollout_logratio_abs_max < 1e-4


def test_perturbed_behaviour_log_probs_each_mode_acts(model):
    samples = _samples(model, perturbed=True)
    stats = {mode: _step(model, samples, mode) for mode in ("none", "tis", "mis", "token_mask")}
    for mode, s in stats.items():
        assert s.loss == pytest.approx(_expected(mode), abs=1e-4), mode
        assert s.tokens == 9
        # the mismatch is measured under every mode, none included: KL by k3 over the 9 tokens, |δ|'s max
        kl = sum(math.exp(-d) - 1 + d for delta in DELTAS for d in delta) / 9
        assert s.rollout_kl_mean == pytest.approx(kl, abs=1e-5), mode
        assert s.rollout_logratio_abs_max == pytest.approx(1.0, abs=1e-4)
        # |δ| sorted: 0 0 .3 .3 .3 .3 .5 1 1 -> p50 = 0.3; p99 at 0.99 · 8 = 7.92: between 1 and 1
        assert s.rollout_logratio_abs_p50 == pytest.approx(0.3, abs=1e-4)
        assert s.rollout_logratio_abs_p99 == pytest.approx(1.0, abs=1e-4)
    # none: the loss as before the correction existed, nothing corrected, unit weights
    assert stats["none"].rollout_corrected_fraction == 0.0 and stats["none"].rollout_weight_mean == 1.0
    # tis: one token over C (ρ = e, weight 2)
    assert stats["tis"].rollout_corrected_fraction == pytest.approx(1 / 9)
    assert stats["tis"].rollout_corrected_samples == 1
    w = [min(math.exp(-d), 2.0) for delta in DELTAS for d in delta]
    assert stats["tis"].rollout_weight_mean == pytest.approx(sum(w) / 9, abs=1e-5)
    # mis: samples 0 and 2 dropped (2 + 4 tokens), their tokens still in the mean's denominator
    assert stats["mis"].rollout_corrected_samples == 2
    assert stats["mis"].rollout_corrected_fraction == pytest.approx(6 / 9)
    # token_mask: ρ = e and e⁻¹ are outside [0.5, 2]
    assert stats["token_mask"].rollout_corrected_fraction == pytest.approx(2 / 9)
    assert stats["token_mask"].rollout_corrected_samples == 2
    losses = {mode: s.loss for mode, s in stats.items()}
    assert len({round(v, 4) for v in losses.values()}) == 4, losses  # each mode a loss of its own


@pytest.mark.parametrize("mode", ["tis", "mis", "token_mask"])
def test_under_decoupled_ppo_the_correction_takes_the_place_of_its_weight(model, mode):
    """ratio=decoupled with a correction: the same ratio against π_old, the correction's weight, not both."""
    samples = _samples(model, perturbed=True)
    cfg = LearnerConfig(rollout_correction=mode, ratio="decoupled", low_prob_mask="off", max_grad_norm=1e9)
    cfg.validate()
    stats = train_step(StepContext(model, torch.optim.SGD(model.parameters(), lr=0.0), samples, cfg, 0))
    assert stats.loss == pytest.approx(_expected(mode), abs=1e-4)
    assert stats.behaviour_weight_mean == 1.0 and stats.behaviour_weight_capped_fraction == 0.0


def test_several_mini_batches_judge_against_the_policy_before_the_update(model):
    """With one optimizer step per sample, π_old is pre-scored before the first: the later mini-batches see
    the same ρ_t (the weights have moved by then)."""
    samples = _samples(model, perturbed=True)
    one = _step(model, samples, "token_mask", lr=0.0)
    several = _step(model, samples, "token_mask", lr=5.0, mini_batch_samples=1)
    assert several.optimizer_steps == 3
    assert several.rollout_corrected_fraction == pytest.approx(one.rollout_corrected_fraction)
    assert several.rollout_kl_mean == pytest.approx(one.rollout_kl_mean, abs=1e-5)
    assert several.rollout_logratio_abs_max == pytest.approx(1.0, abs=1e-4)
