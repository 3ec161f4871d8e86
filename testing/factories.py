"""Hand-made inputs shared by the tests and the benchmarks: trajectories built turn by turn (the one
builder of a synthetic Trajectory from turns: the fuzz seeds, the load and protocol benchmarks, the GPU
check use it too), a tiny Llama (a few thousand weights) that steps in milliseconds on CPU, a trajectory
with every field set for the codec, and the replay buffer's small configurations and trajectories. One
builder each, so a new Trajectory field or check is followed in one place."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS, Assignment, Trajectory, TurnRecord
from replay_buffer.buffer import ReplayBuffer
from replay_buffer.config import ReplayBufferConfig

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM


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


def random_turns(rng: np.random.Generator, prompt_lens: Sequence[int], response_lens: Sequence[int]) -> list[Turn]:
    """Turns of random token ids over SmolLM2's vocabulary, with behaviour log-probs in (-1, 0]: payloads of
    realistic sizes for the load and protocol benchmarks."""
    return [
        Turn(
            prompt=rng.integers(0, 49152, p, dtype=np.int32),
            response=rng.integers(0, 49152, r, dtype=np.int32),
            logprobs=-rng.random(r, dtype=np.float32),
        )
        for p, r in zip(prompt_lens, response_lens)
    ]


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
    **fields,
) -> Trajectory:
    """A validated Trajectory of these turns; unnamed per-turn fields get neutral values, and `fields`
    sets any other field of the episode (actor_id, variation, done)."""
    n = len(turns)
    versions = versions if versions is not None else [0] * n
    num_memories = num_memories if num_memories is not None else [0] * n
    observations = observations if observations is not None else [f"obs {i}" for i in range(n)]
    actions = actions if actions is not None else ["look around"] * n
    records = [
        TurnRecord(
            prompt_ids=np.asarray(t.prompt, dtype=np.int32),
            response_ids=np.asarray(t.response, dtype=np.int32),
            logprobs=np.zeros(len(t.response), np.float32)
            if t.logprobs is None
            else np.asarray(t.logprobs, np.float32),
            observation=observations[i],
            action=actions[i],
            policy_version=versions[i],
            tip_spans=t.tip_spans,
            num_memories=num_memories[i],
        )
        for i, t in enumerate(turns)
    ]
    episode = dict(
        episode_id=episode_id if episode_id is not None else f"{group_id}-{slot}",
        group_id=group_id,
        slot=slot,
        actor_id="actor-0",
        task=task,
        variation=0,
        mode=mode,
        score=score,
        done=True,
    )
    traj = Trajectory.from_turns(records, **{**episode, **fields})
    traj.validate()
    return traj


def tiny_llama(vocab: int, seed: int = 0, heads: int = 4, kv_heads: int = 2, **config) -> LlamaForCausalLM:
    """A 2-layer Llama of width 32; `config` overrides LlamaConfig fields (e.g. initializer_range
    for sharper log-probs, tie_word_embeddings as the embedded SmolLM2 has)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

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


# ------------------------------------------------------------------------------------ codec


def make_trajectory(
    episode_id: str = "ep-1",
    group_id: str = "group-1",
    slot: int = 0,
    mode: str = ON_POLICY,
    prompt_lens: tuple[int, ...] = (5, 3),
    response_lens: tuple[int, ...] = (2, 4),
    tip_spans: np.ndarray | None = None,
    versions: tuple[int, ...] | None = None,
    score: float = 37.5,
) -> Trajectory:
    n = len(prompt_lens)
    p_total, r_total = sum(prompt_lens), sum(response_lens)
    return Trajectory(
        episode_id=episode_id,
        group_id=group_id,
        slot=slot,
        actor_id="actor-3",
        task="find-living-thing",
        variation=7,
        mode=mode,
        score=score,
        done=True,
        prompt_token_ids=np.arange(100, 100 + p_total, dtype=np.int32),
        prompt_offsets=np.concatenate([[0], np.cumsum(prompt_lens)]).astype(np.int64),
        response_token_ids=np.arange(500, 500 + r_total, dtype=np.int32),
        response_offsets=np.concatenate([[0], np.cumsum(response_lens)]).astype(np.int64),
        behaviour_logprobs=-np.linspace(0.1, 2.0, r_total, dtype=np.float32),
        tip_spans=np.zeros((0, 3), np.int32) if tip_spans is None else tip_spans,
        policy_versions=np.array(versions if versions is not None else [4] * n, np.int32),
        num_memories=np.arange(n, dtype=np.int32),
        observations=[f"obs {i} \u00e9" for i in range(n)],
        actions=[f"look at {i}" for i in range(n)],
        memory_retrieved=np.array([i % 2 for i in range(n)], np.uint8),
        generated_texts=[f"Look at {i}.\n" for i in range(n)],
        success=score > 70,  # done
    )


# ------------------------------------------------------------------------------------ replay buffer


VARIATIONS = {"boil": [4, 9, 13], "melt": [1, 2], "unused": [0]}


def make_cfg(**overrides) -> ReplayBufferConfig:
    values = dict(
        tasks=["boil", "melt"],
        variations_per_task=2,
        group_size=3,
        p_memory=0.5,
        q_off_policy=0.5,
        max_open_groups=2,
        assignment_timeout_s=10.0,
    )
    values.update(overrides)
    return ReplayBufferConfig(**values)


def make_buffer(seed: int = 0, **overrides) -> ReplayBuffer:
    return ReplayBuffer(make_cfg(**overrides), VARIATIONS, seed=seed)


def make_traj(
    group_id: str,
    slot: int,
    *,
    episode_id: str | None = None,
    task: str = "boil",
    variation: int = 4,
    mode: str = ON_POLICY,
    versions: tuple[int, ...] = (5, 5),
    prompt_len: int = 3,
) -> Trajectory:
    """A valid trajectory (passes Trajectory.validate) with one `prompt_len`-token prompt and
    2-token response per turn."""
    n = len(versions)
    traj = Trajectory(
        episode_id=episode_id or f"{group_id}-{slot}",
        group_id=group_id,
        slot=slot,
        actor_id="actor-0",
        task=task,
        variation=variation,
        mode=mode,
        score=float(10 * slot % 100),
        done=True,
        prompt_token_ids=(np.arange(prompt_len * n) % 1000).astype(np.int32),
        prompt_offsets=np.arange(0, prompt_len * n + 1, prompt_len, dtype=np.int64),
        response_token_ids=np.arange(2 * n, dtype=np.int32),
        response_offsets=np.arange(0, 2 * n + 1, 2, dtype=np.int64),
        behaviour_logprobs=np.full(2 * n, -0.5, np.float32),
        tip_spans=np.zeros((0, 3), np.int32),
        policy_versions=np.array(versions, np.int32),
        num_memories=np.zeros(n, np.int32),
        observations=[f"obs {i}" for i in range(n)],
        actions=[f"act {i}" for i in range(n)],
    )
    traj.validate()
    return traj


def traj_for(a: Assignment, **kw) -> Trajectory:
    return make_traj(a.group_id, a.slot, task=a.task, variation=a.variation, mode=a.mode, **kw)


def open_group(buffer: ReplayBuffer, now: float = 0.0) -> list[Assignment]:
    """Hand out every slot of one new group."""
    assignments = [buffer.assign(now)[0] for _ in range(buffer.cfg.group_size)]
    assert len({a.group_id for a in assignments}) == 1
    return assignments
