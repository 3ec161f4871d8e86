"""The learner step's parts (learner/step.py): the running totals reduced by name, the token means
of StepStats.from_totals, the pad micro-batch, and the phase timers, recorded and exported."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

import learner.step as step_mod
from common.metrics import LearnerMetrics
from learner import distributed
from learner.config import LearnerConfig
from learner.samples import TurnSample
from learner.step import (
    PHASES,
    PhaseTimer,
    PreScores,
    StepContext,
    StepStats,
    StepTotals,
    micro_batch_loss,
    train_step,
)
from learner.train import step_record
from learner.weight_push import PushTiming
from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS
from testing.factories import mixed_group, tiny_llama

SUMS = dict(
    loss=-3.5,
    kept_tokens=7,
    forward_tokens=40,
    masked_samples=2,
    masked_on_policy=1,
    masked_on_policy_tips=1,
    masked_off_policy=0,
    masked_tip_samples=1,
    ratio=7.7,
    clipped=2.0,
    dual_clipped=1.0,
    approx_kl=0.07,
    behaviour_weight=6.3,
    behaviour_weight_capped=1.0,
    entropy=14.0,
    kl=0.35,
    mismatch=1.5,
    mismatch_tokens=3,
    rollout_tokens=6,
    rollout_kl=0.12,
    rollout_weight=5.4,
    rollout_corrected=1.0,
    rollout_corrected_samples=1,
)
MAXIMA = dict(
    ratio_max=1.4, mismatch_max=0.9, rollout_logratio_max=0.8, rollout_logratio_p50=0.1, rollout_logratio_p99=0.7
)


def _totals(scale: float = 1.0) -> StepTotals:
    return StepTotals(**{k: type(v)(v * scale) for k, v in SUMS.items()}, **{k: v * scale for k, v in MAXIMA.items()})


def test_totals_add_sums_and_keeps_the_maxima():
    totals = StepTotals()
    totals.add(_totals())
    totals.add(_totals(2))
    for name, value in SUMS.items():
        assert getattr(totals, name) == pytest.approx(3 * value), name
    for name, value in MAXIMA.items():
        assert getattr(totals, name) == pytest.approx(2 * value), name


def test_totals_all_reduce_in_a_group_of_one_is_the_identity():
    distributed.init("cpu")
    assert distributed.world_size() == 1
    totals = _totals()
    reduced = totals.all_reduce()
    assert reduced == totals and reduced is not totals
    assert isinstance(reduced.kept_tokens, int) and isinstance(reduced.masked_samples, int)
    assert isinstance(reduced.mismatch_tokens, int)


def test_totals_all_reduce_sums_and_maxes_each_field_by_name(monkeypatch):
    """Two ranks holding the same totals: every sum doubles, every maximum stays."""
    distributed.init("cpu")
    calls = []

    def two_equal_ranks(values, op):
        calls.append(op)
        return [2 * v if op == distributed.dist.ReduceOp.SUM else v for v in values]

    monkeypatch.setattr(distributed, "all_reduce", two_equal_ranks)
    reduced = _totals().all_reduce()
    assert calls == [distributed.dist.ReduceOp.SUM, distributed.dist.ReduceOp.MAX]  # one collective per op
    for name, value in SUMS.items():
        assert getattr(reduced, name) == pytest.approx(2 * value), name
    for name, value in MAXIMA.items():
        assert getattr(reduced, name) == value, name
    assert {f.name for f in dataclasses.fields(StepTotals)} == SUMS.keys() | MAXIMA.keys()


def test_step_stats_from_totals_gives_token_means():
    samples = [_sample(advantage=a) for a in (1.0, -2.0, 0.5, -0.5, 0.0)]
    stats = StepStats.from_totals(_totals(), samples, lr=3e-6)
    # token means over the 7 kept tokens
    assert stats.loss == pytest.approx(-0.5)
    assert stats.ratio_mean == pytest.approx(1.1)
    assert stats.clip_fraction == pytest.approx(2 / 7)
    assert stats.dual_clip_fraction == pytest.approx(1 / 7)
    assert stats.approx_kl == pytest.approx(0.01)
    assert stats.behaviour_weight_mean == pytest.approx(0.9)
    assert stats.behaviour_weight_capped_fraction == pytest.approx(1 / 7)
    assert stats.entropy_mean == pytest.approx(2.0)
    assert stats.kl_mean == pytest.approx(0.05)
    # the mismatch over its own 3 tokens; counts and maxima as they are
    assert stats.logprob_mismatch_mean_nats == pytest.approx(0.5)
    assert (stats.tokens, stats.samples_masked, stats.mismatch_tokens) == (7, 2, 3)
    assert (stats.ratio_max, stats.logprob_mismatch_max_nats) == (1.4, 0.9)
    # the rollout correction's over its own 6 tokens (HeRL's aside); maxima and counts as they are
    assert stats.rollout_kl_mean == pytest.approx(0.02) and stats.rollout_weight_mean == pytest.approx(0.9)
    assert stats.rollout_corrected_fraction == pytest.approx(1 / 6) and stats.rollout_corrected_samples == 1
    assert stats.rollout_logratio_abs_max == 0.8
    assert (stats.rollout_logratio_abs_p50, stats.rollout_logratio_abs_p99) == (0.1, 0.7)
    assert stats.samples == 5 and stats.lr == 3e-6
    assert stats.advantage_abs_mean == pytest.approx(0.8)  # every sample's |A|, masked or not
    assert stats.zero_advantage_fraction == pytest.approx(1 / 5)  # the sample of an all-equal group


def test_step_stats_from_no_kept_tokens_is_zero_not_a_division_error():
    stats = StepStats.from_totals(StepTotals(masked_samples=3), [], lr=1e-6)
    assert stats.loss == 0.0 and stats.ratio_mean == 0.0 and stats.tokens == 0 and stats.samples_masked == 3
    assert stats.advantage_abs_mean == 0.0 and stats.logprob_mismatch_mean_nats == 0.0
    assert stats.zero_advantage_fraction == 0.0


# ------------------------------------------------ the micro-batch loss and the phases, on a tiny model

VOCAB = 32


@pytest.fixture
def model() -> LlamaForCausalLM:
    return tiny_llama(
        VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
    )


def _sample(advantage: float = 1.0, mode: str = ON_POLICY, with_tips: bool = False, version: int = 0) -> TurnSample:
    prompt = np.array([1, 2, 3, 4, 5], np.int32)
    return TurnSample(
        update_prompt=prompt,
        tipfree_prompt=prompt[:3] if with_tips else prompt,
        response=np.array([6, 7], np.int32),
        behaviour_logp=np.full(2, -3.0, np.float32),
        advantage=advantage,
        mode=mode,
        policy_version=version,
        with_tips=with_tips,
    )


def test_an_empty_micro_batch_scores_a_pad_that_stays_out_of_the_loss(model, monkeypatch):
    """A rank with no micro-batch left still runs a forward and a backward (FSDP), with nothing in the loss."""
    forwards = []
    real = step_mod.batch_log_softmax
    monkeypatch.setattr(step_mod, "batch_log_softmax", lambda *args: forwards.append(args) or real(*args))
    loss, totals = micro_batch_loss(model, [], PreScores([], None), LearnerConfig(), version=0)
    assert len(forwards) == 1
    assert loss.numel() == 0 and loss.requires_grad
    loss.sum().backward()
    assert totals == StepTotals()  # nothing kept, nothing masked, no mismatch


def test_micro_batch_loss_masks_on_the_prescored_tipfree_minimum(model):
    tips = _sample(mode=ON_POLICY_TIPS, with_tips=True)
    cfg = LearnerConfig(low_prob_threshold=-5.0, low_prob_mask="tip_rollouts")
    _, dropped = micro_batch_loss(model, [tips], PreScores([-5.5], None), cfg, version=0)
    _, kept = micro_batch_loss(model, [tips], PreScores([-4.5], None), cfg, version=0)
    assert (dropped.masked_samples, dropped.kept_tokens) == (1, 0)
    assert (kept.masked_samples, kept.kept_tokens) == (0, 2)


def test_train_step_times_its_phases(model):
    timer = PhaseTimer()
    samples = [_sample(1.0), _sample(-1.0, ON_POLICY_TIPS, True)]
    train_step(
        StepContext(model, torch.optim.SGD(model.parameters(), lr=0.0), samples, LearnerConfig(), 0, timer=timer)
    )
    assert list(timer.seconds) == ["score", "forward_backward", "optimizer"]  # in the order they ran
    assert all(s >= 0 for s in timer.seconds.values())


def test_train_step_on_cpu_gives_the_heap_back_between_each_forward_and_its_backward(model, monkeypatch):
    """The forward's freed temporaries go back to the kernel before the backward allocates its own
    (learner/step.py), once per micro-batch."""
    events = []
    real = step_mod.micro_batch_loss

    def forward(*args, **kwargs):
        loss, totals = real(*args, **kwargs)
        events.append("forward")
        loss.register_hook(lambda grad: events.append("backward"))
        return loss, totals

    monkeypatch.setattr(step_mod, "micro_batch_loss", forward)
    monkeypatch.setattr(step_mod, "release_free_heap", lambda: events.append("trim"))
    cfg = LearnerConfig(micro_batch_tokens=1)  # each sample its own micro-batch
    train_step(StepContext(model, torch.optim.SGD(model.parameters(), lr=0.0), [_sample(1.0), _sample(-1.0)], cfg, 0))
    assert events == ["forward", "trim", "backward"] * 2


def test_phase_timer_adds_up_repeated_phases(monkeypatch):
    clock = iter([10.0, 10.5, 20.0, 21.0, 30.0, 30.25])
    monkeypatch.setattr(step_mod.time, "perf_counter", lambda: next(clock))
    timer = PhaseTimer()
    for phase in ("push", "checkpoint", "push"):
        with timer.phase(phase):
            pass
    assert timer.seconds == {"push": 0.75, "checkpoint": 1.0}
    with pytest.raises(AssertionError):
        with timer.phase("not a phase"):
            pass


def test_step_record_carries_the_phases_and_the_metrics_export_them(model):
    timer = PhaseTimer()
    with timer.phase("batch_wait"):
        trajectories = mixed_group(0)
    stats = train_step(
        StepContext(model, torch.optim.SGD(model.parameters(), lr=0.0), [_sample()], LearnerConfig(), 0, timer=timer)
    )
    with timer.phase("push"):
        push = PushTiming(seconds=0.25, engine_seconds=0.125)
    record = step_record(1, trajectories, stats, timer.seconds, step_s=1.5, push=push)
    assert list(record["phase_seconds"]) == [p for p in PHASES if p in timer.seconds]
    assert set(record["phase_seconds"]) == {"batch_wait", "score", "forward_backward", "optimizer", "push"}

    metrics = LearnerMetrics()
    metrics.observe_step(record)
    metrics.observe_step(record)
    value = metrics.registry.get_sample_value
    for phase, seconds in record["phase_seconds"].items():
        assert value("empo2_learner_phase_seconds_count", {"phase": phase}) == 2
        assert value("empo2_learner_phase_seconds_sum", {"phase": phase}) == pytest.approx(2 * seconds)
    assert value("empo2_learner_phase_seconds_count", {"phase": "checkpoint"}) is None  # no checkpoint this step
    assert value("empo2_learner_steps_total") == 2
    assert record["optimizer_steps"] == 1 and value("empo2_learner_optimizer_steps_total") == 2
    assert value("empo2_learner_step_seconds_sum") == pytest.approx(3.0)
    assert value("empo2_learner_weight_push_engine_seconds") == 0.125
    assert value("empo2_learner_policy_version") == 1
    # the masked fraction, overall and by mode; a mode absent from the batch is not set
    assert value("empo2_learner_masked_fraction", {"mode": "all"}) == record["masked_fraction"]
    assert value("empo2_learner_masked_fraction", {"mode": "on_policy"}) == record["masked_fraction_on_policy"]
    assert record["masked_fraction_off_policy"] is None
    assert value("empo2_learner_masked_fraction", {"mode": "off_policy"}) is None


def test_step_record_scores_per_mode_and_sums_the_actors_phases(model):
    trajectories = mixed_group(0)  # scores 0, 25, 50, 75 in modes on, tips, off, on; all done
    for t in trajectories:
        t.phase_seconds = {"generation": 1.0, "env_step": 0.5}
    trajectories[3].success = True  # done and 75 > 70
    stats = train_step(StepContext(model, torch.optim.SGD(model.parameters(), lr=0.0), [_sample()], LearnerConfig(), 0))
    record = step_record(1, trajectories, stats, {}, step_s=1.0, push=PushTiming(seconds=0.0, engine_seconds=0.0))
    assert record["record"] == "step"
    assert record["episodes_by_mode"] == {ON_POLICY: 2, ON_POLICY_TIPS: 1, OFF_POLICY: 1}
    assert record["score_mean_by_mode"][ON_POLICY] == pytest.approx(37.5)
    assert record["success_rate"] == 0.25 and record["success_rate_by_mode"][ON_POLICY] == 0.5
    assert record["rollout_phase_seconds"] == {"generation": 4.0, "env_step": 2.0}
    assert record["env_steps"] == 8 and record["staleness_max_versions"] == 0
