"""Micro-batching (learner.micro_batch_tokens): samples sorted by length into right-padded
micro-batches give the same step as scoring them one at a time: same loss, gradients and updated
weights, with masked samples, mixed lengths, all three modes, the KL reference and the entropy."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from learner.config import LearnerConfig
from learner.policy_model import response_logprobs
from learner.samples import TurnSample
from learner.step import StepContext, micro_batches, train_step
from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS
from testing.factories import tiny_llama

VOCAB = 48


def test_micro_batches_by_hand():
    # sorted by length: 2 (len 3), 0 (len 4), 3 (len 5), 1 (len 9); budget 10 padded tokens
    # [2, 0]: 2 x 4 = 8; + 3 would be 3 x 5 = 15 > 10 -> new batch; [3]: 5; + 1: 2 x 9 = 18 -> alone
    assert micro_batches([4, 9, 3, 5], 10) == [[2, 0], [3], [1]]
    assert micro_batches([4, 9, 3, 5], 1) == [[2], [0], [3], [1]]  # one at a time
    assert micro_batches([4, 9, 3, 5], 100) == [[2, 0, 3, 1]]


def _model() -> LlamaForCausalLM:
    return tiny_llama(VOCAB, seed=7, initializer_range=0.2)


def _samples(model) -> list[TurnSample]:
    rng = np.random.default_rng(3)
    out = []
    for i, mode in enumerate([ON_POLICY, ON_POLICY_TIPS, OFF_POLICY] * 3):
        prompt = rng.integers(0, VOCAB, rng.integers(4, 30)).astype(np.int32)
        tipfree = prompt[: max(2, len(prompt) - 3)]
        response = rng.integers(0, VOCAB, rng.integers(1, 6)).astype(np.int32)
        with_tips = mode != ON_POLICY
        scored = tipfree if mode == OFF_POLICY else prompt
        with torch.no_grad():
            behaviour = response_logprobs(
                model, torch.from_numpy(prompt.astype(np.int64)), torch.from_numpy(response.astype(np.int64))
            )
        behaviour = (behaviour.numpy() + rng.normal(0, 0.2, len(response))).astype(np.float32)
        out.append(
            TurnSample(
                scored,
                tipfree if with_tips else prompt,
                response,
                behaviour,
                float(rng.normal()),
                mode,
                1 + i % 2,
                with_tips,
            )
        )
    return out


@pytest.mark.parametrize("rule", ["tip_rollouts", "paper"])
@pytest.mark.parametrize("ratio", ["plain", "decoupled"])
def test_batched_step_equals_one_sample_at_a_time(ratio, rule):
    base = _model()
    samples = _samples(base)
    # a threshold between the tip samples' tip-free minima: some are masked, some kept
    with torch.no_grad():
        minima = sorted(
            float(
                response_logprobs(
                    base,
                    torch.from_numpy(s.tipfree_prompt.astype(np.int64)),
                    torch.from_numpy(s.response.astype(np.int64)),
                ).min()
            )
            for s in samples
            if s.with_tips
        )
        ref = copy.deepcopy(base).requires_grad_(False)
        for p in ref.parameters():  # the reference differs from the policy, so the KL term has a gradient
            p.add_(0.05 * torch.randn_like(p))
    threshold = (minima[2] + minima[3]) / 2
    results = {}
    for budget in (1, 64, 4096):
        model = copy.deepcopy(base)
        cfg = LearnerConfig(
            micro_batch_tokens=budget,
            low_prob_threshold=threshold,
            low_prob_mask=rule,
            entropy_coef=0.01,
            kl_coef=0.1,
            ratio=ratio,
            max_grad_norm=1e9,
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        stats = train_step(StepContext(model, optimizer, samples, cfg, version=1, ref_model=ref))
        results[budget] = (stats, {n: p.grad.clone() for n, p in model.named_parameters()}, model.state_dict())
    one, _, _ = results[1]
    # tip_rollouts judges the 6 tip samples; the paper's rule judges all 9
    assert 0 < one.samples_masked < (6 if rule == "tip_rollouts" else 9) and one.kl_mean > 0 and one.entropy_mean > 0
    for budget in (64, 4096):
        stats, grads, weights = results[budget]
        for field in (
            "loss",
            "tokens",
            "samples_masked",
            "masked_fraction_on_policy",
            "masked_fraction_on_policy_tips",
            "masked_fraction_off_policy",
            "ratio_mean",
            "ratio_max",
            "clip_fraction",
            "entropy_mean",
            "kl_mean",
            "logprob_mismatch_mean_nats",
            "mismatch_tokens",
        ):
            assert getattr(stats, field) == pytest.approx(getattr(one, field), rel=1e-5, abs=1e-6), field
        for name, g in grads.items():
            torch.testing.assert_close(g, results[1][1][name], rtol=1e-4, atol=1e-6, msg=name)
        for name, w in weights.items():
            torch.testing.assert_close(w, results[1][2][name], rtol=1e-4, atol=1e-6, msg=name)
