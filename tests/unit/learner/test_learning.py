"""Does the update learn? A toy one-step task with a tiny model: after a few learner steps, the
probability of the rewarded action rises, for each preset (conf/preset/*.yaml loaded as a run
loads them: EMPO2 with all three modes, GRPO, GiGPO, RND). Trajectories go through the real path:
build_samples (advantages, tip removal) -> train_step (EMPO2 loss), with behaviour log-probs from
the current policy as a server would give."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from learner.advantages import CountBonus
from learner.config import LearnerConfig
from learner.rnd import RNDBonus
from learner.samples import GiGPO, build_samples
from learner.step import StepContext, train_step
from pipeline.config import load_config
from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS, Trajectory
from testing.factories import Turn, tiny_llama, trajectory
from tests.helpers import logprobs

PROMPT = np.array([5, 6, 7, 8], dtype=np.int32)
TIP = np.array([20, 21, 22], dtype=np.int32)  # a "tip block" inserted after token 2
GOOD, BAD = np.array([3], dtype=np.int32), np.array([4], dtype=np.int32)


def _model() -> LlamaForCausalLM:
    return tiny_llama(32, num_attention_heads=2, max_position_embeddings=64)


def _episode(model, mode: str, action: np.ndarray, score: float, slot: int, version: int) -> Trajectory:
    with_tips = mode != ON_POLICY
    prompt = np.concatenate([PROMPT[:2], TIP, PROMPT[2:]]) if with_tips else PROMPT
    spans = [(2, 2 + len(TIP))] if with_tips else []
    return trajectory(
        [Turn(prompt=prompt, response=action, logprobs=logprobs(model, prompt, action), tip_spans=spans)],
        mode=mode,
        score=score,
        group_id=f"g{version}",
        slot=slot,
        episode_id=f"{version}-{slot}",
        task="t",
        versions=[version],
        num_memories=[1],
        observations=["the same state"],
        actions=["good" if action is GOOD else "bad"],
    )


@pytest.mark.parametrize(
    "preset, mode",
    [
        ("empo2", ON_POLICY),
        ("empo2", ON_POLICY_TIPS),
        ("empo2", OFF_POLICY),
        ("grpo", ON_POLICY),
        ("gigpo", ON_POLICY),
        ("rnd", ON_POLICY),
    ],
)
def test_rewarded_action_becomes_more_likely(preset, mode):
    run = load_config([f"preset={preset}"])  # the preset file, on the dataclass defaults
    assert (run.replay_buffer.p_memory > 0) == (preset in ("empo2", "rnd"))  # tip modes only where p > 0
    assert mode == ON_POLICY or run.replay_buffer.p_memory > 0
    # a large learning rate for a few toy steps; no mask (the tiny model's log-probs are all low)
    cfg = replace(run.learner, lr=3e-3, low_prob_threshold=None)
    gigpo = GiGPO(cfg.gigpo_gamma, cfg.gigpo_step_weight, cfg.gigpo_step_norm) if cfg.advantage == "gigpo" else None
    assert (gigpo is not None) == (preset == "gigpo")
    intrinsic = RNDBonus(cfg, run.seed) if cfg.intrinsic_kind == "rnd" else CountBonus(cfg.intrinsic_coef)
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    before = float(np.exp(logprobs(model, PROMPT, GOOD))[0])  # evaluated WITHOUT tips, as EMPO2 is
    for version in range(4):
        group = [
            _episode(model, mode, GOOD, 100.0, 0, version),
            _episode(model, mode, BAD, 0.0, 1, version),
            _episode(model, mode, GOOD, 100.0, 2, version),
            _episode(model, mode, BAD, 0.0, 3, version),
        ]
        samples = build_samples(group, cfg.score_scale, intrinsic, cfg.adv_eps, gigpo)
        stats = train_step(StepContext(model, optimizer, samples, cfg, version))
        assert stats.tokens == 4
    after = float(np.exp(logprobs(model, PROMPT, GOOD))[0])
    assert after > before * 1.5, (before, after)
    assert float(np.exp(logprobs(model, PROMPT, BAD))[0]) < after


def test_entropy_and_kl_options_enter_the_step():
    import copy

    cfg = LearnerConfig(lr=3e-3, low_prob_threshold=None, entropy_coef=0.01, kl_coef=0.1)
    model = _model()
    ref = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    group = [_episode(model, ON_POLICY, GOOD, 100.0, 0, 0), _episode(model, ON_POLICY, BAD, 0.0, 1, 0)]
    first = train_step(StepContext(model, optimizer, build_samples(group, 0.01, CountBonus(1.0), 1e-6), cfg, 0, ref))
    assert first.entropy_mean > 0.0 and first.kl_mean == pytest.approx(0.0, abs=1e-7)  # θ = πref at first
    second = train_step(StepContext(model, optimizer, build_samples(group, 0.01, CountBonus(1.0), 1e-6), cfg, 1, ref))
    assert second.kl_mean > 0.0  # the policy moved away from the reference
