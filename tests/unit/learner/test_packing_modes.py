"""learner.packing on chained trajectories (actors/env_actor/prompts.py's Chat with the embedded model's real
tokenizer, on a tiny Llama of its vocabulary): every turn scored in one sequence per chain (episode),
or with the group's common prefix once (group), gives the log-probs and the optimizer step that one
sequence per turn gives, in every mode (on-policy, with tips, off-policy with the tips removed) and
across a chain the history trim broke; and it forwards fewer tokens."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from actors.env_actor.prompts import Demonstration, PromptBuilder, TaskContext
from learner import distributed
from learner.advantages import CountBonus
from learner.config import LearnerConfig
from learner.policy_model import response_logprobs
from learner.samples import build_samples
from learner.step import StepContext, score_before_update, segments, train_step
from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS
from testing.factories import Turn, tiny_llama, trajectory

CTX = TaskContext(
    task="Your task is to find a(n) living thing. First, focus on the thing.",
    demonstration=Demonstration(1, "Your task is to find a(n) animal.", ["open door to hallway", "go to hallway"]),
    action_templates=["open OBJ", "go to OBJ", "focus on OBJ", "look around"],
)
STATES = [f"This room is called the room {i}. In it, you see: a table, a chair, door {i + 1}." for i in range(5)]
TIPS = [["Open doors before going through."], ["Animals are living things.", "Look in the greenhouse."]]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from common.model_prep import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("embedded:SmolLM2-135M-Instruct"))


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_llama(len(tokenizer), seed=5, initializer_range=0.1, max_position_embeddings=4096)


def _episode(model, builder, slot: int, mode: str, rng) -> object:
    """One episode played on a chat: random responses (some ending in the end-of-sequence token, as
    vLLM returns them), tips in the tip modes, behaviour log-probs of the prompt played (with tips)
    off by some noise."""
    chat = builder.chat(CTX)
    turns, starts = [], []
    for t, state in enumerate(STATES):
        tips = TIPS[t % 2] if mode != ON_POLICY else []
        prompt = chat.prompt(state, tips)
        response = rng.integers(100, 5000, rng.integers(2, 6)).astype(np.int32)
        if rng.random() < 0.5:
            response = np.append(response, builder.tokenizer.eos_token_id).astype(np.int32)
        with torch.no_grad():
            lp = response_logprobs(
                model, torch.from_numpy(prompt.token_ids.astype(np.int64)), torch.from_numpy(response)
            )
        turns.append(Turn(prompt.token_ids, response, lp.numpy() + rng.normal(0, 0.1, len(response)), prompt.tip_spans))
        starts.append(prompt.chain_start)
        chat.answered(state, tips, "", response)
    traj = trajectory(turns, mode=mode, score=float(rng.integers(0, 100)), slot=slot, num_memories=[1] * len(turns))
    traj.chain_starts = np.asarray(starts, np.uint8)
    traj.validate()
    return traj


@pytest.fixture(scope="module")
def samples(model, tokenizer):
    rng = np.random.default_rng(0)
    whole = PromptBuilder(tokenizer, history_window=0, token_budget=100_000)
    episodes = [
        _episode(model, whole, slot, mode, rng)
        for slot, mode in enumerate([ON_POLICY] * 2 + [ON_POLICY_TIPS] * 2 + [OFF_POLICY] * 2)
    ]
    # one more whose history is trimmed once: the budget is the prompt of its 4th turn, so its 5th starts a chain
    budget = len(whole.chat(CTX).prompt(STATES[0], TIPS[0]).token_ids) + 60
    trimmed = _episode(model, PromptBuilder(tokenizer, 0, budget), 6, OFF_POLICY, rng)
    assert trimmed.chain_starts.tolist().count(1) >= 2
    assert all(t.chain_starts.tolist() == [1, 0, 0, 0, 0] for t in episodes)
    built = build_samples(episodes + [trimmed], 1.0, CountBonus(0.5), 1e-6)
    return built, sum(int(t.chain_starts.sum()) for t in episodes + [trimmed])


def test_the_segments_are_the_chains(samples):
    built, chains = samples
    assert len(segments(built, "turn")) == len(built) == 35
    assert len(segments(built, "episode")) == len(segments(built, "group")) == chains


@pytest.mark.parametrize("budget", [1024, 100_000])
def test_every_packing_scores_the_same_log_probs(model, samples, budget):
    """Per turn (the KL reference's pass and the tip-free pass of the tip_rollouts mask): within 1e-5 nats."""
    built, _ = samples
    distributed.init("cpu")  # a group of one, as train_step makes it
    scored = {}
    for packing in ("turn", "episode", "group"):
        pre = score_before_update(
            model, model, built, budget, tipfree_mask=True, segs=segments(built, packing), share=packing == "group"
        )
        scored[packing] = pre
    turn = scored["turn"]
    assert sum(m is not None for m in turn.mask_logp_min) == 10  # the on-policy-with-tips turns
    for packing in ("episode", "group"):
        for a, b in zip(turn.ref_logp, scored[packing].ref_logp):
            assert float((a - b).abs().max()) < 1e-5
        for a, b in zip(turn.mask_logp_min, scored[packing].mask_logp_min):
            assert (a is None and b is None) or abs(a - b) < 1e-5


def test_every_packing_takes_the_same_step_and_forwards_fewer_tokens(model, samples):
    built, chains = samples
    distributed.init("cpu")
    # a mask threshold at the median of the samples' minimum log-probs: some judged samples go, some stay
    pre = score_before_update(model, model, built, 4096, tipfree_mask=True)
    threshold = float(
        np.median([float(m if m is not None else lp.min()) for m, lp in zip(pre.mask_logp_min, pre.ref_logp)])
    )
    ref = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():
        for p in ref.parameters():  # the reference differs from the policy, so the KL term has a gradient
            p.add_(0.02 * torch.randn_like(p))
    results = {}
    for packing in ("turn", "episode", "group"):
        policy = copy.deepcopy(model)
        cfg = LearnerConfig(
            packing=packing,
            mini_batch_samples=0,
            micro_batch_tokens=2048,
            low_prob_mask="tip_rollouts",
            low_prob_threshold=threshold,
            kl_coef=0.1,
            entropy_coef=0.01,
            max_grad_norm=1e9,
        )
        stats = train_step(
            StepContext(policy, torch.optim.SGD(policy.parameters(), lr=1.0), built, cfg, version=0, ref_model=ref)
        )
        results[packing] = (stats, policy.state_dict())
    turn, turn_weights = results["turn"]
    assert turn.tokens > 0 and turn.kl_mean > 0 and 0 < turn.samples_masked < 25
    for packing in ("episode", "group"):
        stats, weights = results[packing]
        for field in ("tokens", "samples_masked", "optimizer_steps"):
            assert getattr(stats, field) == getattr(turn, field), (packing, field)
        for field in ("loss", "ratio_mean", "kl_mean", "entropy_mean", "logprob_mismatch_mean_nats"):
            assert getattr(stats, field) == pytest.approx(getattr(turn, field), abs=1e-5), (packing, field)
        for name, value in turn_weights.items():
            assert float((weights[name] - value).abs().max()) < 1e-6, (packing, name)
        assert model.state_dict()["model.embed_tokens.weight"].ne(turn_weights["model.embed_tokens.weight"]).any()
    # each chain once; then the group's common prefix (system part, first turn) once more
    assert results["group"][0].forward_tokens < results["episode"][0].forward_tokens < turn.forward_tokens / 2
    assert turn.segments == 35 and results["episode"][0].segments == results["group"][0].segments == chains
