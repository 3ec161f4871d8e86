"""The low-probability mask (learner.low_prob_mask, paper Figure 6): which turn samples each rule
judges, on which prompt, the masked fraction by mode, and that a masked sample adds no gradient.

    paper         every mode while memory is in use, on the prompt the sample is updated on
    tip_rollouts  samples rolled out with tips only, on the tip-free prompt
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from learner.config import LearnerConfig
from learner.loss import mask_subject
from learner.samples import TurnSample
from learner.step import StepContext, train_step
from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS
from testing.factories import tiny_llama
from tests.helpers import logprobs

VOCAB = 64
BASE = np.array([1, 2, 3, 4, 5, 6], np.int32)
WITH_TIPS = np.concatenate([BASE[:4], np.array([40, 41, 42, 43, 44], np.int32), BASE[4:]])


@pytest.mark.parametrize(
    "rule, memory_in_use, with_tips, judged",
    [
        # the paper's rule: every sample while memory is in use, none without memory (p = 0, GRPO)
        ("paper", True, False, True),
        ("paper", True, True, True),
        ("paper", False, False, False),
        ("paper", False, True, False),
        # the earlier rule: the samples rolled out with tips, memory or not
        ("tip_rollouts", True, False, False),
        ("tip_rollouts", True, True, True),
        ("tip_rollouts", False, True, True),
        ("off", True, True, False),
        ("off", True, False, False),
    ],
)
def test_which_samples_each_rule_judges(rule, memory_in_use, with_tips, judged):
    assert mask_subject(rule, memory_in_use, with_tips) is judged


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama(
        VOCAB, seed=1234, hidden_size=16, num_attention_heads=2, intermediate_size=32, initializer_range=0.2
    ).eval()


def _three_modes(model) -> dict[str, TurnSample]:
    """One sample per mode, each with its own response; behaviour = the log-probs the server had."""
    r_on, r_tips, r_off = (np.array(x, np.int32) for x in ([7, 8], [9, 10, 11], [12, 13, 14, 15]))
    return {
        ON_POLICY: TurnSample(BASE, BASE, r_on, logprobs(model, BASE, r_on), 1.0, ON_POLICY, 0, False),
        ON_POLICY_TIPS: TurnSample(
            WITH_TIPS, BASE, r_tips, logprobs(model, WITH_TIPS, r_tips), -0.5, ON_POLICY_TIPS, 0, True
        ),
        OFF_POLICY: TurnSample(BASE, BASE, r_off, logprobs(model, WITH_TIPS, r_off), 0.5, OFF_POLICY, 0, True),
    }


def _cfg(rule: str, threshold: float) -> LearnerConfig:
    return LearnerConfig(low_prob_mask=rule, low_prob_threshold=threshold, max_grad_norm=1e9)


def test_mask_decisions_per_mode_under_both_rules(model):
    samples = _three_modes(model)
    # the minimum response log-prob of each sample on each prompt (an independent scorer)
    on = float(logprobs(model, BASE, samples[ON_POLICY].response).min())
    tips_with = float(logprobs(model, WITH_TIPS, samples[ON_POLICY_TIPS].response).min())  # its update prompt
    tips_free = float(logprobs(model, BASE, samples[ON_POLICY_TIPS].response).min())  # its tip-free prompt
    off = float(logprobs(model, BASE, samples[OFF_POLICY].response).min())  # update prompt = tip-free
    assert tips_with != tips_free  # the two rules judge the with-tips sample on different log-probs
    values = sorted({on, tips_with, tips_free, off})
    thresholds = [values[0] - 1.0] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1] + 1.0]
    differ = 0
    for threshold in thresholds:
        # by hand: masked iff the judged minimum is below the threshold
        expected = {
            "paper": {ON_POLICY: on < threshold, ON_POLICY_TIPS: tips_with < threshold, OFF_POLICY: off < threshold},
            "tip_rollouts": {ON_POLICY: False, ON_POLICY_TIPS: tips_free < threshold, OFF_POLICY: off < threshold},
        }
        differ += expected["paper"][ON_POLICY_TIPS] != expected["tip_rollouts"][ON_POLICY_TIPS]
        for rule, masked in expected.items():
            opt = torch.optim.SGD(model.parameters(), lr=0.0)
            stats = train_step(
                StepContext(model, opt, list(samples.values()), _cfg(rule, threshold), 0, memory_in_use=True)
            )
            got = {
                ON_POLICY: stats.masked_fraction_on_policy,
                ON_POLICY_TIPS: stats.masked_fraction_on_policy_tips,
                OFF_POLICY: stats.masked_fraction_off_policy,
            }
            assert got == {mode: float(m) for mode, m in masked.items()}, (rule, threshold)
            assert stats.samples_masked == sum(masked.values())
            assert stats.masked_fraction == pytest.approx(sum(masked.values()) / 3)
            # the tip turns (rolled out with tips: on-policy with tips, off-policy) the mask kept
            assert stats.tip_samples == 2
            assert stats.tip_samples_trained_fraction == 1.0 - (masked[ON_POLICY_TIPS] + masked[OFF_POLICY]) / 2
            kept_tokens = sum(len(samples[mode].response) for mode, m in masked.items() if not m)
            assert stats.tokens == kept_tokens
    assert differ > 0  # some threshold tells the rules apart on the with-tips sample


def test_the_paper_rule_masks_nothing_without_memory_and_off_masks_nothing(model):
    samples = list(_three_modes(model).values())
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for rule, memory_in_use in (("paper", False), ("off", True)):
        # all below 0
        stats = train_step(StepContext(model, opt, samples, _cfg(rule, 0.0), 0, memory_in_use=memory_in_use))
        assert stats.samples_masked == 0 and stats.tokens == 9, rule
    stats = train_step(StepContext(model, opt, samples, _cfg("paper", 0.0), 0, memory_in_use=True))
    assert stats.samples_masked == 3 and stats.tokens == 0 and stats.masked_fraction == 1.0


def test_the_masked_fraction_of_a_mode_absent_from_the_batch_is_none(model):
    samples = _three_modes(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = train_step(StepContext(model, opt, [samples[ON_POLICY]], _cfg("paper", 0.0), 0))
    assert stats.masked_fraction_on_policy == 1.0
    assert stats.masked_fraction_on_policy_tips is None and stats.masked_fraction_off_policy is None
    assert stats.tip_samples == 0 and stats.tip_samples_trained_fraction is None


@pytest.mark.parametrize("rule", ["paper", "tip_rollouts"])
def test_masked_samples_contribute_no_gradient(model, rule):
    samples = _three_modes(model)
    # the minimum each rule judges each sample on (on-policy: not judged by tip_rollouts)
    judged = {
        OFF_POLICY: float(logprobs(model, BASE, samples[OFF_POLICY].response).min()),
        ON_POLICY_TIPS: float(
            logprobs(model, WITH_TIPS if rule == "paper" else BASE, samples[ON_POLICY_TIPS].response).min()
        ),
    }
    if rule == "paper":
        judged[ON_POLICY] = float(logprobs(model, BASE, samples[ON_POLICY].response).min())
    # a threshold between the lowest judged minimum and the next: that sample alone is dropped
    (dropped, lowest), (_, second) = sorted(judged.items(), key=lambda kv: kv[1])[:2]
    assert lowest < second
    threshold = (lowest + second) / 2
    kept = [s for mode, s in samples.items() if mode != dropped]
    grads = {}
    cfg = dataclasses.replace(_cfg(rule, threshold), micro_batch_tokens=1)  # one sample per pass: exact sums
    for name, batch in (("with", list(samples.values())), ("without", kept)):
        m = copy.deepcopy(model)
        stats = train_step(StepContext(m, torch.optim.SGD(m.parameters(), lr=0.0), batch, cfg, 0))
        assert stats.tokens == sum(len(s.response) for s in kept) and stats.samples_masked == (name == "with")
        grads[name] = {n: p.grad.clone() for n, p in m.named_parameters()}
    for name, g in grads["with"].items():
        torch.testing.assert_close(g, grads["without"][name], rtol=0, atol=0, msg=name)

    # a batch of masked samples only: no step, the weights stay (even with AdamW's weight decay)
    m = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = torch.optim.AdamW(m.parameters(), lr=1.0, weight_decay=0.01)
    stats = train_step(StepContext(m, opt, [samples[dropped]], _cfg(rule, threshold), 0))
    assert stats.samples_masked == 1 and stats.tokens == 0
    for n, p in m.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
