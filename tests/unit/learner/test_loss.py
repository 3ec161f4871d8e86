"""The EMPO2 clipped objective (learner/loss.py) and its use in learner.step.train_step.

Golden values are written out by hand (the arithmetic is in the comments); nothing here
re-implements the formula of learner/loss.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import learner.step as step_mod
from learner.config import LearnerConfig
from learner.loss import ClipConfig, LossInputs, clipped_policy_loss, empo2_loss, low_probability_mask
from learner.samples import TurnSample
from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS
from tests.helpers import logprobs

CLIP = ClipConfig(clip_low=0.2, clip_high=0.3, dual_clip=10.0)


def _loss(ratios, advantages, clip=CLIP):
    """Per-token loss and diagnostics for the given ratios (behaviour log-prob 0, logp = log r)."""
    logp = torch.tensor([math.log(r) for r in ratios], dtype=torch.float32)
    behaviour = torch.zeros_like(logp)
    adv = torch.tensor(advantages, dtype=torch.float32)
    return clipped_policy_loss(logp, behaviour, adv, clip)


# ----------------------------------------------------------------------- golden values


def test_positive_advantage_inside_clip_range_is_minus_a_times_r():
    loss, diag = _loss([1.1], [2.0])
    # r = 1.1 in [0.8, 1.3]: L = -A * r = -2 * 1.1 = -2.2
    assert loss.tolist() == pytest.approx([-2.2], abs=1e-5)
    assert diag["ratio"].tolist() == pytest.approx([1.1], abs=1e-6)
    assert diag["clipped"].tolist() == [False]
    assert diag["dual_clipped"].tolist() == [False]


def test_positive_advantage_ratio_above_clip_high_is_clipped():
    loss, diag = _loss([1.5], [1.0])
    # L1 = -1 * 1.5 = -1.5, L2 = -1 * clip(1.5, 0.8, 1.3) = -1.3, max = -1.3
    assert loss.tolist() == pytest.approx([-1.3], abs=1e-5)
    assert diag["clipped"].tolist() == [True]
    assert diag["dual_clipped"].tolist() == [False]


def test_positive_advantage_ratio_below_clip_low_is_not_clipped():
    loss, diag = _loss([0.5], [1.0])
    # L1 = -0.5, L2 = -0.8, max = -0.5 (pessimistic side: unclipped)
    assert loss.tolist() == pytest.approx([-0.5], abs=1e-5)
    assert diag["clipped"].tolist() == [False]


def test_negative_advantage_ratio_below_clip_low_is_clipped():
    loss, diag = _loss([0.5], [-2.0])
    # L1 = -(-2) * 0.5 = 1.0, L2 = -(-2) * 0.8 = 1.6, max = 1.6; min(1.6, 2 * 10 = 20) = 1.6
    assert loss.tolist() == pytest.approx([1.6], abs=1e-5)
    assert diag["clipped"].tolist() == [True]
    assert diag["dual_clipped"].tolist() == [False]


def test_negative_advantage_moderately_large_ratio_is_unclipped():
    loss, diag = _loss([2.0], [-1.0])
    # L1 = 2.0, L2 = 1.3, max = 2.0; dual bound 10 not reached -> 2.0
    assert loss.tolist() == pytest.approx([2.0], abs=1e-5)
    assert diag["clipped"].tolist() == [False]
    assert diag["dual_clipped"].tolist() == [False]


def test_dual_clip_bounds_negative_advantage_with_huge_ratio():
    loss, diag = _loss([20.0, 20.0, 1.0], [-1.0, -0.5, -1.0])
    # token 0: L1 = 20, L2 = 1.3, max = 20, min(20, 1 * 10) = 10
    # token 1: L1 = 0.5 * 20 = 10, L2 = 0.5 * 1.3 = 0.65, max = 10, min(10, 0.5 * 10 = 5) = 5
    # token 2: r = 1: L1 = L2 = 1, min(1, 10) = 1
    assert loss.tolist() == pytest.approx([10.0, 5.0, 1.0], abs=1e-4)
    assert diag["dual_clipped"].tolist() == [True, True, False]
    # the ordinary clip is not what bounds these tokens (L2 < L1)
    assert diag["clipped"].tolist() == [False, False, False]


def test_dual_clip_does_not_apply_to_positive_advantages():
    loss, diag = _loss([20.0], [1.0])
    # A > 0: L1 = -20, L2 = -1.3, max = -1.3 (no dual bound)
    assert loss.tolist() == pytest.approx([-1.3], abs=1e-5)
    assert diag["dual_clipped"].tolist() == [False]
    assert diag["clipped"].tolist() == [True]


def test_per_token_flags_on_a_mixed_batch():
    loss, diag = _loss([1.1, 1.5, 0.5, 20.0], [2.0, 1.0, -2.0, -1.0])
    # hand values of the four tests above
    assert loss.tolist() == pytest.approx([-2.2, -1.3, 1.6, 10.0], abs=1e-4)
    assert diag["clipped"].tolist() == [False, True, True, False]
    assert diag["dual_clipped"].tolist() == [False, False, False, True]


def test_asymmetric_clip_low_and_high_behave_differently():
    # (clip_low 0.2, clip_high 0.3): clip range [0.8, 1.3]
    loss, diag = _loss([0.7, 1.4], [-1.0, 1.0])
    # r = 0.7, A = -1: L1 = 0.7, L2 = 0.8 -> 0.8 (lower bound 1 - 0.2)
    # r = 1.4, A = +1: L1 = -1.4, L2 = -1.3 -> -1.3 (upper bound 1 + 0.3)
    assert loss.tolist() == pytest.approx([0.8, -1.3], abs=1e-5)
    assert diag["clipped"].tolist() == [True, True]
    # swapped (clip_low 0.3, clip_high 0.2): clip range [0.7, 1.2]
    swapped = ClipConfig(clip_low=0.3, clip_high=0.2, dual_clip=10.0)
    loss, diag = _loss([0.7, 1.4], [-1.0, 1.0], swapped)
    # r = 0.7, A = -1: L1 = 0.7, L2 = 0.7 -> 0.7 (not clipped: at the bound)
    # r = 1.4, A = +1: L1 = -1.4, L2 = -1.2 -> -1.2
    assert loss.tolist() == pytest.approx([0.7, -1.2], abs=1e-5)
    # a ratio of 1.25 is inside [0.8, 1.3] but above a symmetric 1.2
    loss, diag = _loss([1.25], [1.0])
    assert loss.tolist() == pytest.approx([-1.25], abs=1e-5)
    assert diag["clipped"].tolist() == [False]


def test_approx_kl_k3_estimator_values():
    logp = torch.tensor([math.log(2.0), -math.log(2.0), 0.0])
    loss, diag = clipped_policy_loss(logp, torch.zeros(3), torch.ones(3), CLIP)
    # logratio = ln 2:  (2 - 1) - 0.693147 = 0.306853
    # logratio = -ln 2: (0.5 - 1) + 0.693147 = 0.193147
    # logratio = 0:     (1 - 1) - 0 = 0
    assert diag["approx_kl"].tolist() == pytest.approx([0.306853, 0.193147, 0.0], abs=1e-5)


def test_ratio_uses_difference_to_behaviour_logprob():
    # logp = -1.0, behaviour = -1.5: r = exp(0.5) = 1.648721 -> clipped to 1.3 for A = 1
    loss, diag = clipped_policy_loss(torch.tensor([-1.0]), torch.tensor([-1.5]), torch.tensor([1.0]), CLIP)
    assert diag["ratio"].tolist() == pytest.approx([1.648721], abs=1e-5)
    assert loss.tolist() == pytest.approx([-1.3], abs=1e-5)


def test_diagnostics_are_detached_and_loss_has_grad():
    logp = torch.tensor([0.1, 0.2], requires_grad=True)
    loss, diag = clipped_policy_loss(logp, torch.zeros(2), torch.ones(2), CLIP)
    assert loss.requires_grad
    assert all(not v.requires_grad for v in diag.values())


# ------------------------------------------------------------------------- gradients


def test_gradient_inside_clip_range_is_minus_a_times_r():
    logp = torch.tensor([math.log(1.1)], requires_grad=True)
    loss, _ = clipped_policy_loss(logp, torch.zeros(1), torch.tensor([2.0]), CLIP)
    loss.sum().backward()
    # d/dlogp (-A * exp(logp - b)) = -A * r = -2 * 1.1 = -2.2
    assert logp.grad.tolist() == pytest.approx([-2.2], abs=1e-5)


def test_gradient_inside_clip_range_negative_advantage():
    logp = torch.tensor([math.log(0.9)], requires_grad=True)
    loss, _ = clipped_policy_loss(logp, torch.zeros(1), torch.tensor([-3.0]), CLIP)
    loss.sum().backward()
    # -A * r = 3 * 0.9 = 2.7
    assert logp.grad.tolist() == pytest.approx([2.7], abs=1e-5)


@pytest.mark.parametrize(
    "ratio, advantage",
    [
        (1.5, 1.0),  # above 1 + clip_high, A > 0
        (0.5, -2.0),  # below 1 - clip_low, A < 0
        (20.0, -1.0),  # dual clip
    ],
)
def test_gradient_of_clipped_token_is_zero(ratio, advantage):
    logp = torch.tensor([math.log(ratio)], requires_grad=True)
    loss, _ = clipped_policy_loss(logp, torch.zeros(1), torch.tensor([advantage]), CLIP)
    loss.sum().backward()
    assert logp.grad.tolist() == [0.0]


# ------------------------------------------------------------------ low-probability mask


def test_low_probability_mask():
    # kept when the rule does not judge the sample (e.g. tip_rollouts and no tips), whatever the log-prob
    assert low_probability_mask(-50.0, subject=False, threshold=-5.0) is True
    # kept when the mask is disabled
    assert low_probability_mask(-50.0, subject=True, threshold=None) is True
    # dropped below the threshold with tips
    assert low_probability_mask(-5.01, subject=True, threshold=-5.0) is False
    assert low_probability_mask(-7.0, subject=True, threshold=-5.0) is False
    # exactly at the threshold: kept
    assert low_probability_mask(-5.0, subject=True, threshold=-5.0) is True
    assert low_probability_mask(-0.3, subject=True, threshold=-5.0) is True


# ------------------------------------------------------------- empo2_loss on a hand-built micro-batch


def test_empo2_loss_clips_one_token_and_leaves_the_masked_one_out():
    # three tokens, behaviour log-prob 0: r = 2 (A = 1, clipped at 1.3), r = 1.1 (A = 1, inside the range),
    # and r = e^5 (A = −1) of a sample the mask dropped: it would hit the dual clip if it were in the loss
    logp = torch.tensor([math.log(2.0), math.log(1.1), 5.0], requires_grad=True)
    inputs = LossInputs(
        logp=logp,
        log_softmax=torch.full((3, 4), math.log(0.25)),  # a uniform policy over 4 tokens: H_t = log 4
        behaviour_logp=torch.zeros(3),
        proximal_logp=None,
        ref_logp=None,
        advantages=torch.tensor([1.0, 1.0, -1.0]),
        hindsight=torch.zeros(3, dtype=torch.bool),
        sample=torch.tensor([0, 0, 1]),
        keep=torch.tensor([True, True, False]),
    )
    loss, metrics = empo2_loss(inputs, LearnerConfig(clip_low=0.2, clip_high=0.3, dual_clip=10.0))
    # N = 2 kept tokens: L = −A · clip(2, 0.8, 1.3) = −1.3 and −A · r = −1.1
    assert loss.tolist() == pytest.approx([-1.3, -1.1], abs=1e-6)
    loss.sum().backward()
    # the clipped token and the masked one give no gradient; the other −A · r = −1.1
    assert logp.grad.tolist() == pytest.approx([0.0, -1.1, 0.0], abs=1e-6)
    assert metrics["kept_tokens"] == 2 and metrics["loss"] == pytest.approx(-2.4, abs=1e-6)
    assert metrics["clipped"] == 1.0 and metrics["dual_clipped"] == 0.0
    assert metrics["ratio"] == pytest.approx(3.1, abs=1e-6) and metrics["ratio_max"] == pytest.approx(2.0)
    assert metrics["entropy"] == pytest.approx(2 * math.log(4), abs=1e-6) and "kl" not in metrics
    assert metrics["rollout_tokens"] == 2 and metrics["rollout_weight"] == 2.0  # no correction: w_t = 1


# ---------------------------------------------------- train_step: the three EMPO2 modes

VOCAB = 64
TIP = np.array([40, 41, 42, 43, 44], dtype=np.int32)  # the tip block's tokens


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1234)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=32,
        tie_word_embeddings=False,
        max_position_embeddings=128,
        initializer_range=0.2,
    )
    model = LlamaForCausalLM(config).float()
    model.eval()
    return model


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.0)


def _prompt_with_tips():
    base = np.array([1, 2, 3, 4, 5, 6], dtype=np.int32)
    with_tips = np.concatenate([base[:4], TIP, base[4:]]).astype(np.int32)
    return base, with_tips


def _sample(update_prompt, tipfree_prompt, response, behaviour, advantage, mode, version, with_tips):
    return TurnSample(
        update_prompt=update_prompt,
        tipfree_prompt=tipfree_prompt,
        response=np.asarray(response, dtype=np.int32),
        behaviour_logp=np.asarray(behaviour, dtype=np.float32),
        advantage=advantage,
        mode=mode,
        policy_version=version,
        with_tips=with_tips,
    )


def _expected_loss(model, scored):
    """Token mean of clipped_policy_loss over (prompt, sample) pairs: the independent reference."""
    total, tokens = 0.0, 0
    for prompt, s in scored:
        logp = torch.from_numpy(logprobs(model, prompt, s.response))
        adv = torch.full_like(logp, s.advantage)
        loss, _ = clipped_policy_loss(logp, torch.from_numpy(s.behaviour_logp), adv, CLIP)
        total += float(loss.sum())
        tokens += logp.numel()
    return total / tokens, tokens


@pytest.fixture
def recorder(monkeypatch):
    """Record every prompt train_step scores (and whether grad was enabled)."""
    calls = []
    real = step_mod.batch_log_softmax

    def recording(model, batch):  # rows of scored sequences: one turn each here, its prompt before its span
        calls.extend((seq.tokens[: seq.spans[0][0]].copy(), torch.is_grad_enabled()) for row in batch for seq in row)
        return real(model, batch)

    monkeypatch.setattr(step_mod, "batch_log_softmax", recording)
    return calls


def _cfg(**kw):
    kw.setdefault("low_prob_threshold", -1e9)
    return LearnerConfig(clip_low=0.2, clip_high=0.3, dual_clip=10.0, **kw)


def test_off_policy_sample_scores_tipfree_prompt_against_tip_behaviour(tiny_model, recorder):
    base, with_tips = _prompt_with_tips()
    response = np.array([7, 8, 9], dtype=np.int32)
    behaviour = logprobs(tiny_model, with_tips, response)  # the server sampled with tips in the prompt
    s = _sample(base, base, response, behaviour, 1.0, OFF_POLICY, 3, True)
    expected, _ = _expected_loss(tiny_model, [(base, s)])
    # had the learner scored the prompt with tips, r = 1 on every token and the loss would be -1
    wrong, _ = _expected_loss(tiny_model, [(with_tips, s)])
    assert wrong == pytest.approx(-1.0, abs=1e-5)
    assert abs(expected - wrong) > 1e-3  # the test can tell the two prompts apart

    stats = step_mod.train_step(step_mod.StepContext(tiny_model, _sgd(tiny_model), [s], _cfg(), version=3))

    assert len(recorder) == 1  # no separate tip-free pass: the update prompt is already tip-free
    np.testing.assert_array_equal(recorder[0][0], base)
    assert recorder[0][1] is True  # scored with grad
    assert stats.loss == pytest.approx(expected, abs=1e-5)
    assert stats.tokens == 3 and stats.samples == 1 and stats.samples_masked == 0


def test_on_policy_tips_sample_scores_full_prompt_with_tips(tiny_model, recorder):
    base, with_tips = _prompt_with_tips()
    response = np.array([10, 11], dtype=np.int32)
    true = logprobs(tiny_model, with_tips, response)
    behaviour = true - np.float32(0.1)  # r = exp(0.1) = 1.105 on each token: inside the clip range
    s = _sample(with_tips, base, response, behaviour, 2.0, ON_POLICY_TIPS, 5, True)
    expected, _ = _expected_loss(tiny_model, [(with_tips, s)])
    # -A * r = -2 * exp(0.1) = -2 * 1.1051709 = -2.2103418
    assert expected == pytest.approx(-2.2103418, abs=1e-4)

    stats = step_mod.train_step(
        step_mod.StepContext(tiny_model, _sgd(tiny_model), [s], _cfg(low_prob_mask="tip_rollouts"), version=5)
    )

    # tip_rollouts: the tip-free prompt for the mask, without grad (first); the update prompt with tips, with grad
    assert len(recorder) == 2
    np.testing.assert_array_equal(recorder[0][0], base)
    assert recorder[0][1] is False
    np.testing.assert_array_equal(recorder[1][0], with_tips)
    assert recorder[1][1] is True
    assert stats.loss == pytest.approx(-2.2103418, abs=1e-4)
    assert stats.ratio_mean == pytest.approx(1.1051709, abs=1e-4)
    assert stats.clip_fraction == 0.0


def test_the_paper_mask_judges_the_update_pass_so_no_tipfree_pass_runs(tiny_model, recorder):
    base, with_tips = _prompt_with_tips()
    response = np.array([10, 11], dtype=np.int32)
    s = _sample(with_tips, base, response, logprobs(tiny_model, with_tips, response), 2.0, ON_POLICY_TIPS, 5, True)
    with_tips_min = float(logprobs(tiny_model, with_tips, response).min())
    tipfree_min = float(logprobs(tiny_model, base, response).min())
    assert _cfg().low_prob_mask == "paper"  # the default

    stats = step_mod.train_step(step_mod.StepContext(tiny_model, _sgd(tiny_model), [s], _cfg(), version=5))

    assert len(recorder) == 1  # the update pass only, with tips and with grad
    np.testing.assert_array_equal(recorder[0][0], with_tips)
    assert recorder[0][1] is True
    assert stats.samples_masked == 0
    # judged on the with-tips minimum: a threshold between the two minima decides by it, not the tip-free one
    threshold = (with_tips_min + tipfree_min) / 2
    masked = step_mod.train_step(
        step_mod.StepContext(tiny_model, _sgd(tiny_model), [s], _cfg(low_prob_threshold=threshold), version=5)
    )
    assert masked.samples_masked == int(with_tips_min < threshold)
    legacy_cfg = _cfg(low_prob_threshold=threshold, low_prob_mask="tip_rollouts")
    legacy = step_mod.train_step(step_mod.StepContext(tiny_model, _sgd(tiny_model), [s], legacy_cfg, version=5))
    assert legacy.samples_masked == int(tipfree_min < threshold) != masked.samples_masked


def test_on_policy_sample_scores_its_prompt_once(tiny_model, recorder):
    base, _ = _prompt_with_tips()
    response = np.array([12, 13, 14, 15], dtype=np.int32)
    behaviour = logprobs(tiny_model, base, response)
    s = _sample(base, base, response, behaviour, -1.0, ON_POLICY, 0, False)

    stats = step_mod.train_step(step_mod.StepContext(tiny_model, _sgd(tiny_model), [s], _cfg(), version=0))

    assert len(recorder) == 1
    np.testing.assert_array_equal(recorder[0][0], base)
    # r = 1, A = -1: L = 1 on every token
    assert stats.loss == pytest.approx(1.0, abs=1e-5)
    assert stats.ratio_mean == pytest.approx(1.0, abs=1e-5)
    assert stats.approx_kl == pytest.approx(0.0, abs=1e-5)


def test_low_probability_mask_drops_tip_samples_and_loss_is_token_mean_of_kept(tiny_model):
    base, with_tips = _prompt_with_tips()
    r_on, r_tips, r_off = (np.array(x, dtype=np.int32) for x in ([7, 8], [9, 10, 11], [12, 13, 14, 15]))
    on = _sample(base, base, r_on, logprobs(tiny_model, base, r_on) + np.float32(0.05), 1.5, ON_POLICY, 2, False)
    tips = _sample(with_tips, base, r_tips, logprobs(tiny_model, with_tips, r_tips), -0.7, ON_POLICY_TIPS, 2, True)
    off = _sample(base, base, r_off, logprobs(tiny_model, with_tips, r_off), 0.4, OFF_POLICY, 1, True)
    samples = [on, tips, off]
    # any real log-prob is below -0.01: every tip sample is dropped, the no-tip one is kept
    cfg = _cfg(low_prob_threshold=-0.01, low_prob_mask="tip_rollouts")
    assert float(logprobs(tiny_model, base, r_tips).min()) < -0.01
    expected, tokens = _expected_loss(tiny_model, [(base, on)])
    assert tokens == 2

    stats = step_mod.train_step(step_mod.StepContext(tiny_model, _sgd(tiny_model), samples, cfg, version=2))

    assert stats.samples == 3
    assert stats.samples_masked == 2
    assert stats.tokens == 2
    assert stats.loss == pytest.approx(expected, abs=1e-5)
    # |A| mean over all samples, masked ones included: (1.5 + 0.7 + 0.4) / 3
    assert stats.advantage_abs_mean == pytest.approx(2.6 / 3, abs=1e-6)


def test_loss_is_token_mean_over_all_kept_samples(tiny_model):
    base, with_tips = _prompt_with_tips()
    r_on, r_tips, r_off = (np.array(x, dtype=np.int32) for x in ([7, 8], [9, 10, 11], [12, 13, 14, 15]))
    on = _sample(base, base, r_on, logprobs(tiny_model, base, r_on) + np.float32(0.05), 1.5, ON_POLICY, 2, False)
    tips = _sample(with_tips, base, r_tips, logprobs(tiny_model, with_tips, r_tips), -0.7, ON_POLICY_TIPS, 2, True)
    off = _sample(base, base, r_off, logprobs(tiny_model, with_tips, r_off), 0.4, OFF_POLICY, 1, True)
    expected, tokens = _expected_loss(tiny_model, [(base, on), (with_tips, tips), (base, off)])
    assert tokens == 9
    # a per-sample mean would weight the samples equally instead: it must differ here
    per_sample = np.mean([_expected_loss(tiny_model, [p])[0] for p in [(base, on), (with_tips, tips), (base, off)]])
    assert abs(per_sample - expected) > 1e-3
    before = [p.detach().clone() for p in tiny_model.parameters()]

    stats = step_mod.train_step(step_mod.StepContext(tiny_model, _sgd(tiny_model), [on, tips, off], _cfg(), version=2))

    assert stats.samples_masked == 0 and stats.tokens == 9
    assert stats.loss == pytest.approx(expected, abs=1e-5)
    # lr = 0: the weights are untouched, but gradients were produced
    assert all(torch.equal(a, b) for a, b in zip(before, tiny_model.parameters()))
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in tiny_model.parameters())


def test_logprob_mismatch_only_from_same_version_same_prompt_samples(tiny_model):
    base, with_tips = _prompt_with_tips()
    r1, r2, r3, r4 = (np.array(x, dtype=np.int32) for x in ([7, 8, 9], [10, 11], [12, 13], [14, 15, 16]))
    version = 4
    # counted: on-policy, current version, behaviour = true + 0.5
    on = _sample(base, base, r1, logprobs(tiny_model, base, r1) + np.float32(0.5), 0.5, ON_POLICY, version, False)
    # counted: on-policy with tips (update prompt == behaviour prompt), behaviour = true - 0.5
    tips = _sample(
        with_tips, base, r2, logprobs(tiny_model, with_tips, r2) - np.float32(0.5), 0.5, ON_POLICY_TIPS, version, True
    )
    # not counted: off-policy with tips (learner scores another prompt), offset 2.0
    off = _sample(base, base, r3, logprobs(tiny_model, base, r3) + np.float32(2.0), 0.5, OFF_POLICY, version, True)
    # not counted: an older version, offset 3.0
    stale = _sample(
        base, base, r4, logprobs(tiny_model, base, r4) + np.float32(3.0), 0.5, ON_POLICY, version - 1, False
    )

    stats = step_mod.train_step(
        step_mod.StepContext(tiny_model, _sgd(tiny_model), [on, tips, off, stale], _cfg(), version=version)
    )

    assert stats.mismatch_tokens == 3 + 2
    assert stats.logprob_mismatch_mean_nats == pytest.approx(0.5, abs=1e-4)
    assert stats.logprob_mismatch_max_nats == pytest.approx(0.5, abs=1e-4)


def test_off_policy_turn_without_tips_counts_for_mismatch(tiny_model):
    # off-policy mode but retrieval returned nothing: the update prompt is the behaviour prompt
    base, _ = _prompt_with_tips()
    r = np.array([7, 8], dtype=np.int32)
    s = _sample(base, base, r, logprobs(tiny_model, base, r) + np.float32(0.25), 1.0, OFF_POLICY, 1, False)
    cfg = _cfg(low_prob_threshold=-0.01, low_prob_mask="tip_rollouts")
    stats = step_mod.train_step(step_mod.StepContext(tiny_model, _sgd(tiny_model), [s], cfg, version=1))
    assert stats.samples_masked == 0  # no tips: never masked (by the tip_rollouts rule)
    assert stats.mismatch_tokens == 2
    assert stats.logprob_mismatch_mean_nats == pytest.approx(0.25, abs=1e-4)
