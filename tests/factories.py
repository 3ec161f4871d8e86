"""Hand-made inputs shared by the learner's tests: trajectories built turn by turn, and a tiny
Llama (a few thousand weights) that steps in milliseconds on CPU. One builder each, so a new
Trajectory field or check is followed in one place."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from transformers import LlamaConfig, LlamaForCausalLM

from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS, Trajectory


@dataclass
class Turn:
    """One turn of an episode as the actor records it: the prompt sent, the tip blocks in it
    (start, end) token spans, the tokens generated and their behaviour log-probs."""

    prompt: Sequence[int]
    response: Sequence[int]
    logprobs: Sequence[float] | None = None  # None: 0.0 per response token
    tip_spans: Sequence[tuple[int, int]] = field(default_factory=tuple)


def plain_turns(n: int, logprob: float = 0.0) -> list[Turn]:
    """n short turns with distinct token ids: prompt [2i, 2i + 1], response [i]."""
    return [Turn(prompt=[2 * i, 2 * i + 1], response=[i], logprobs=[logprob]) for i in range(n)]


def trajectory(
    turns: Sequence[Turn],
    *,
    mode: str = ON_POLICY,
    score: float = 0.0,
    group_id: str = "g",
    slot: int = 0,
    episode_id: str | None = None,
    task: str = "find-living-thing",
    versions: Sequence[int] | None = None,
    num_memories: Sequence[int] | None = None,
    observations: Sequence[str] | None = None,
    actions: Sequence[str] | None = None,
) -> Trajectory:
    """A validated Trajectory of these turns; unnamed per-turn fields get neutral values."""
    n = len(turns)
    prompts = [np.asarray(t.prompt, dtype=np.int32) for t in turns]
    responses = [np.asarray(t.response, dtype=np.int32) for t in turns]
    logprobs = [
        np.zeros(len(r), np.float32) if t.logprobs is None else np.asarray(t.logprobs, dtype=np.float32)
        for t, r in zip(turns, responses)
    ]
    traj = Trajectory(
        episode_id=episode_id if episode_id is not None else f"{group_id}-{slot}",
        group_id=group_id,
        slot=slot,
        actor_id="actor-0",
        task=task,
        variation=0,
        mode=mode,
        score=score,
        done=True,
        prompt_token_ids=np.concatenate(prompts),
        prompt_offsets=np.cumsum([0] + [len(p) for p in prompts]).astype(np.int64),
        response_token_ids=np.concatenate(responses),
        response_offsets=np.cumsum([0] + [len(r) for r in responses]).astype(np.int64),
        behaviour_logprobs=np.concatenate(logprobs),
        tip_spans=np.asarray([(i, s, e) for i, t in enumerate(turns) for s, e in t.tip_spans], np.int32).reshape(-1, 3),
        policy_versions=np.asarray(versions if versions is not None else [0] * n, dtype=np.int32),
        num_memories=np.asarray(num_memories if num_memories is not None else [0] * n, dtype=np.int32),
        observations=list(observations) if observations is not None else [f"obs {i}" for i in range(n)],
        actions=list(actions) if actions is not None else ["look around"] * n,
    )
    traj.validate()
    return traj


def tiny_llama(vocab: int, seed: int = 0, heads: int = 4, kv_heads: int = 2, **config) -> LlamaForCausalLM:
    """A 2-layer Llama of width 32; `config` overrides LlamaConfig fields (e.g. initializer_range
    for sharper log-probs, tie_word_embeddings as the embedded SmolLM2 has)."""
    import torch

    torch.manual_seed(seed)
    base = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(LlamaConfig(**{**base, **config}))


def save_tiny_model(path, vocab: int = 40, **config) -> str:
    """A tiny Llama and a one-word tokenizer saved as a Hugging Face model directory, what the
    learner loads from `model.path`."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tiny_llama(vocab, max_position_embeddings=64, tie_word_embeddings=True, **config).save_pretrained(path)
    PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    ).save_pretrained(path)
    return str(path)


# the modes of a mixed group's 4 slots: on-policy, on-policy with tips, off-policy, on-policy
GROUP_MODES = (ON_POLICY, ON_POLICY_TIPS, OFF_POLICY, ON_POLICY)


def mixed_group(step: int) -> list[Trajectory]:
    """One group of 4 episodes (2 turns, mixed prompt lengths, tips in two), rewarded unevenly, as
    the learner receives it for `step`. Each episode is one chain, as the actors build them: the
    second prompt is the first prompt, its response and new tokens (its tip span kept where it was,
    a new one after). The near-uniform tiny model (vocab 40) gives every token a log-prob near
    log(1/40) = -3.7, so the mask at -3 drops every tip sample, clearly on every rank."""
    rng = np.random.default_rng(step)
    out = []
    for slot in range(4):
        mode = GROUP_MODES[slot]
        first = rng.integers(3, 40, rng.integers(5, 20))
        responses = [rng.integers(3, 40, rng.integers(1, 4)) for _ in range(2)]
        second = np.concatenate([first, responses[0], rng.integers(3, 40, rng.integers(3, 10))])
        logprobs = rng.uniform(-4, -2, sum(len(r) for r in responses))
        cut = len(responses[0])
        spans = [(1, 3)] if mode != ON_POLICY else []
        later = [(len(first) + cut + 1, len(first) + cut + 2)] if mode != ON_POLICY else []
        turns = [
            Turn(prompt=first, response=responses[0], logprobs=logprobs[:cut], tip_spans=spans),
            Turn(prompt=second, response=responses[1], logprobs=logprobs[cut:], tip_spans=spans + later),
        ]
        episode = group_episode(step, slot, turns)
        episode.chain_starts = np.array([1, 0], np.uint8)
        episode.validate()
        out.append(episode)
    return out


def group_episode(step: int, slot: int, turns: list[Turn]) -> Trajectory:
    """Slot `slot` of a mixed group for `step` holding `turns`: its mode from GROUP_MODES, score
    25 x slot, 2 turns' versions, memories, observations and actions."""
    return trajectory(
        turns,
        mode=GROUP_MODES[slot],
        score=float(25 * slot),
        group_id=f"g{step}",
        slot=slot,
        episode_id=f"{step}-{slot}",
        task="t",
        versions=[step, step],
        num_memories=[1, 3],
        observations=["a room", f"room {slot}"],
        actions=["look", "go"],
    )
