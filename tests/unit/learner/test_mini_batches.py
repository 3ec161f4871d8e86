"""Mini-batch updates (learner.mini_batch_samples, learner.update_epochs): each batch shuffled and
split into mini-batches, one optimizer step each; the same as stepping on each mini-batch in turn;
the clip engages from the second; with decoupled PPO the proximal policy is the pre-batch one;
the learning-rate schedule steps once per batch."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

import learner.loss as loss_mod
import learner.step as step_mod
from learner.config import LearnerConfig
from learner.samples import TurnSample
from learner.step import StepContext, mini_batch_plan, rank_rows, train_step
from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS
from testing.factories import tiny_llama
from tests.helpers import logprobs

VOCAB = 48


def test_mini_batch_plan_by_hand():
    plan = mini_batch_plan([1] * 10, 4, 1, seed=3, version=2)
    # ceil(10 / 4) = 3 mini-batches of near-equal sizes, together a permutation of the batch
    assert [len(mb) for mb in plan] == [4, 3, 3]
    assert sorted(i for mb in plan for i in mb) == list(range(10))
    assert plan != [list(range(4)), list(range(4, 7)), list(range(7, 10))]  # shuffled
    assert mini_batch_plan([1] * 10, 4, 1, seed=3, version=2) == plan  # reproducible (every rank draws the same)
    assert mini_batch_plan([1] * 10, 4, 1, seed=3, version=3) != plan  # a new shuffle per batch
    assert mini_batch_plan([1] * 10, 4, 1, seed=4, version=2) != plan
    # 0, or a size at least the batch: one step over the whole batch, in its order
    assert mini_batch_plan([1] * 10, 0, 1, seed=3, version=2) == [list(range(10))]
    assert mini_batch_plan([1] * 10, 10, 1, seed=3, version=2) == [list(range(10))]
    assert mini_batch_plan([1] * 10, 128, 2, seed=3, version=2) == [list(range(10))] * 2
    # epochs: each a fresh permutation
    two = mini_batch_plan([1] * 10, 5, 2, seed=3, version=2)
    assert len(two) == 4 and all(sorted(two[e] + two[e + 1]) == list(range(10)) for e in (0, 2))
    assert two[:2] != two[2:]
    assert mini_batch_plan([], 128, 1, seed=None, version=0) == [[]]  # nothing: one (empty) pass


def test_mini_batch_plan_never_splits_a_segment():
    # segments of 3, 1, 2, 4 turn samples (10 in all), 4 per mini-batch: ceil(10 / 4) = 3 steps whose
    # quotas are 4, 3, 3 samples (cumulative 4, 7, 10); a segment goes whole into the first step whose
    # cumulative quota the samples before it have not filled, and a step left empty is no step
    sizes = [3, 1, 2, 4]
    for seed in range(20):
        plan = mini_batch_plan(sizes, 4, 1, seed=seed, version=2)
        order = [j for mb in plan for j in mb]
        assert sorted(order) == [0, 1, 2, 3] and 1 <= len(plan) <= 3 and all(plan)
        before = np.cumsum([0] + [sizes[j] for j in order])[:-1]
        step_of = {j: k for k, mb in enumerate(plan) for j in mb}
        first_open = [int(np.searchsorted([4, 7, 10], b, side="right")) for b in before]
        # the steps in order of their (non-empty) first-open index
        assert [step_of[j] for j in order] == [sorted(set(first_open)).index(k) for k in first_open]
    assert mini_batch_plan(sizes, 0, 1, seed=3, version=2) == [[0, 1, 2, 3]]


def _model() -> LlamaForCausalLM:
    return tiny_llama(VOCAB, seed=7, initializer_range=0.2)


def _samples(model, n: int = 12) -> list[TurnSample]:
    """n samples of the three modes; behaviour = the model's own log-probs on the update prompt, so
    that the ratio is 1 (nothing clipped) until the weights move."""
    rng = np.random.default_rng(11)
    out = []
    for i in range(n):
        mode = (ON_POLICY, ON_POLICY_TIPS, OFF_POLICY)[i % 3]
        prompt = rng.integers(0, VOCAB, rng.integers(4, 20)).astype(np.int32)
        tipfree = prompt[: max(2, len(prompt) - 3)]
        update = tipfree if mode == OFF_POLICY else prompt
        response = rng.integers(0, VOCAB, rng.integers(1, 5)).astype(np.int32)
        behaviour = logprobs(model, update, response)
        out.append(
            TurnSample(
                update,
                tipfree if mode != ON_POLICY else prompt,
                response,
                behaviour,
                float(rng.normal()),
                mode,
                0,
                mode != ON_POLICY,
            )
        )
    return out


def _cfg(**kw) -> LearnerConfig:
    kw.setdefault("low_prob_threshold", None)  # no mask: the toy model's log-probs are all low
    return LearnerConfig(lr=0.05, max_grad_norm=1e9, **kw)


class CountingAdamW(torch.optim.AdamW):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.steps, self.lrs = 0, []

    def step(self, closure=None):
        self.steps += 1
        self.lrs.append(self.param_groups[0]["lr"])
        return super().step(closure)


def test_k_mini_batches_take_k_steps_and_equal_stepping_on_each_in_turn():
    base = _model()
    samples = _samples(base)
    cfg = _cfg(mini_batch_samples=4)
    plan = mini_batch_plan([1] * len(samples), 4, 1, seed=5, version=2)
    assert len(plan) == 3

    together = copy.deepcopy(base)
    opt = CountingAdamW(together.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    stats = train_step(StepContext(together, opt, samples, cfg, version=2, seed=5))
    assert stats.optimizer_steps == 3 and opt.steps == 3

    one_by_one = copy.deepcopy(base)
    opt_b = CountingAdamW(one_by_one.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    single = dataclasses.replace(cfg, mini_batch_samples=0)
    parts = [train_step(StepContext(one_by_one, opt_b, [samples[i] for i in mb], single, version=2)) for mb in plan]
    assert opt_b.steps == 3 and all(p.optimizer_steps == 1 for p in parts)

    for (name, a), b in zip(together.state_dict().items(), one_by_one.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.equal(together.state_dict()["lm_head.weight"], base.state_dict()["lm_head.weight"])
    # the batch's statistics aggregate its mini-batches: token sums and token means over all of them
    assert stats.tokens == sum(p.tokens for p in parts) and stats.samples == len(samples)
    assert stats.loss == pytest.approx(sum(p.loss * p.tokens for p in parts) / stats.tokens, rel=1e-5)
    assert stats.clip_fraction == pytest.approx(sum(p.clip_fraction * p.tokens for p in parts) / stats.tokens)
    assert stats.ratio_max == pytest.approx(max(p.ratio_max for p in parts))


def test_the_clip_fraction_is_non_zero_from_the_second_mini_batch():
    base = _model()
    samples = _samples(base)
    # one step on the whole batch: behaviour = the current policy, r = 1, nothing clipped
    whole = copy.deepcopy(base)
    one = train_step(
        StepContext(whole, torch.optim.AdamW(whole.parameters(), lr=0.05), samples, _cfg(mini_batch_samples=0), 0)
    )
    assert one.optimizer_steps == 1 and one.clip_fraction == 0.0
    # in turn: the first mini-batch is unclipped, the weights then move and the second one clips
    plan = mini_batch_plan([1] * len(samples), 6, 1, seed=0, version=0)
    m = copy.deepcopy(base)
    opt = torch.optim.AdamW(m.parameters(), lr=0.05)
    first, second = (
        train_step(StepContext(m, opt, [samples[i] for i in mb], _cfg(mini_batch_samples=0), 0)) for mb in plan
    )
    assert first.clip_fraction == 0.0 and second.clip_fraction > 0.0
    # two mini-batches in one learner step: the clip engages
    m = copy.deepcopy(base)
    two = train_step(
        StepContext(m, torch.optim.AdamW(m.parameters(), lr=0.05), samples, _cfg(mini_batch_samples=6), 0, seed=0)
    )
    assert two.optimizer_steps == 2
    assert two.clip_fraction == pytest.approx(second.clip_fraction * second.tokens / two.tokens, rel=1e-5)
    assert two.clip_fraction > 0.0


def test_with_decoupled_ppo_the_proximal_policy_is_the_one_before_the_batch(monkeypatch):
    base = _model()
    samples = _samples(base)
    before = [torch.from_numpy(logprobs(base, s.update_prompt, s.response)) for s in samples]  # the pre-batch policy
    calls = []
    real = loss_mod.clipped_policy_loss

    def recording(logp, behaviour_logp, advantages, clip, proximal_logp=None, behaviour_weight_cap=None):
        calls.append((logp.detach().clone(), proximal_logp.clone()))
        return real(logp, behaviour_logp, advantages, clip, proximal_logp, behaviour_weight_cap)

    monkeypatch.setattr(loss_mod, "clipped_policy_loss", recording)
    cfg = _cfg(mini_batch_samples=4, ratio="decoupled")
    model = copy.deepcopy(base)
    stats = train_step(
        StepContext(model, torch.optim.AdamW(model.parameters(), lr=0.05), samples, cfg, version=1, seed=9)
    )
    plan = mini_batch_plan([1] * len(samples), 4, 1, seed=9, version=1)
    assert stats.optimizer_steps == len(plan) == len(calls) == 3  # one micro-batch per mini-batch here
    for k, (mb, (logp, proximal)) in enumerate(zip(plan, calls)):
        rows, _ = rank_rows(samples, [[i] for i in mb], cfg.micro_batch_tokens, share=True)
        order = [i for row in rows for seg in row for i in seg]  # the micro-batch's samples, row by row
        expected = torch.cat([before[i] for i in order])
        torch.testing.assert_close(proximal, expected, rtol=1e-5, atol=1e-5)  # every mini-batch: pre-batch
        if k == 0:
            torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)  # nothing moved yet
        else:
            assert float((logp - expected).abs().max()) > 1e-3  # the current weights moved: not πprox


def test_a_single_step_scores_no_proximal_pass(monkeypatch):
    """One optimizer step per batch: πprox is the update pass's own log-probs, no extra pass."""
    base = _model()
    samples = _samples(base, 6)
    passes = []
    real = step_mod.batch_log_softmax
    monkeypatch.setattr(step_mod, "batch_log_softmax", lambda *a: passes.append(torch.is_grad_enabled()) or real(*a))
    sgd = torch.optim.SGD(base.parameters(), lr=0.0)
    train_step(StepContext(base, sgd, samples, _cfg(ratio="decoupled"), 0))
    assert passes == [True]
    passes.clear()
    train_step(StepContext(base, sgd, samples, _cfg(ratio="decoupled", mini_batch_samples=3), 0))
    assert passes == [False, True, True]  # the pre-batch pass without grad, then one per mini-batch


def test_the_schedule_steps_once_per_batch_and_epochs_reshuffle():
    base = _model()
    samples = _samples(base)
    m = copy.deepcopy(base)
    cfg = _cfg(mini_batch_samples=4, update_epochs=2, lr_schedule="linear", total_steps=4)
    opt = CountingAdamW(m.parameters(), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 - k / 4)
    stats = train_step(StepContext(m, opt, samples, cfg, version=0, scheduler=scheduler, seed=1))
    assert stats.optimizer_steps == opt.steps == 6  # 3 mini-batches x 2 epochs
    assert opt.lrs == [cfg.lr] * 6 and stats.lr == cfg.lr  # one lr for the whole batch
    assert scheduler.last_epoch == 1 and opt.param_groups[0]["lr"] == pytest.approx(0.75 * cfg.lr)
    # every sample seen once per epoch: 2 passes of its tokens
    assert stats.tokens == 2 * sum(len(s.response) for s in samples)


def test_epochs_count_each_pass_in_the_masked_fraction():
    base = _model()
    samples = _samples(base, 6)
    m = copy.deepcopy(base)
    cfg = _cfg(mini_batch_samples=3, update_epochs=2, low_prob_threshold=0.0)  # every log-prob is below 0
    stats = train_step(StepContext(m, torch.optim.SGD(m.parameters(), lr=0.1), samples, cfg, 0, memory_in_use=True))
    assert stats.samples_masked == 12 and stats.masked_fraction == 1.0 and stats.masked_fraction_on_policy == 1.0
    assert stats.optimizer_steps == 0 and stats.tokens == 0  # nothing kept: no step
