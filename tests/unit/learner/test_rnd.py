"""RND intrinsic reward (learner/rnd.py, learner.intrinsic_kind=rnd): novelty is rewarded, the
bonus reaches the advantages in every mode, and its state survives a checkpoint round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learner.advantages import CountBonus
from learner.checkpoint import load_trainer_state, save_checkpoint
from learner.config import LearnerConfig
from learner.rnd import RNDBonus, observation_features
from learner.samples import build_samples
from protocol.messages import ON_POLICY, Trajectory
from testing.factories import plain_turns, trajectory

CFG = LearnerConfig(
    intrinsic_kind="rnd", intrinsic_coef=0.5, rnd_feature_dim=256, rnd_hidden=64, rnd_output_dim=16, rnd_lr=1e-2
)
SEEN = "You are in the kitchen. You see a fridge, a sink and a door to the hallway."
NOVEL = "This room is called the greenhouse. In it, you see a bee hive and a flower pot with a seed."


def _traj(observations: list[str], slot: int = 0, score: float = 0.0, mode: str = ON_POLICY) -> Trajectory:
    n = len(observations)
    return trajectory(
        plain_turns(n), mode=mode, score=score, slot=slot, episode_id=f"e{slot}", task="t", observations=observations
    )


def test_features_are_deterministic_normalised_and_word_order_aware():
    a, b, c = observation_features(["open the door", "open the door", "door the open"], 64)
    assert torch.equal(a, b) and float(a.norm()) == pytest.approx(1.0)
    assert not torch.equal(a, c)  # same words, other bigrams


def test_a_novel_observation_gets_a_larger_bonus_than_one_seen_many_times():
    rnd = RNDBonus(CFG, seed=0)
    for _ in range(30):
        rnd([_traj([SEEN, SEEN])])
    ((seen, novel),) = rnd([_traj([SEEN, NOVEL])])
    assert novel > 3 * seen > 0


def test_the_bonus_enters_the_advantages_in_every_mode():
    rnd = RNDBonus(CFG, seed=0)
    for _ in range(30):
        rnd([_traj([SEEN])])
    # same score: with the count bonus in on-policy mode both episodes have advantage 0
    group = [_traj([SEEN], slot=0, score=50.0), _traj([NOVEL], slot=1, score=50.0)]
    count = build_samples(group, 0.01, CountBonus(1.0), 1e-6)
    assert [s.advantage for s in count] == pytest.approx([0.0, 0.0])
    seen, novel = build_samples(group, 0.01, rnd, 1e-6)
    assert novel.advantage > 0 > seen.advantage


def test_checkpoint_round_trip(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=8,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
        )
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    )
    rnd = RNDBonus(CFG, seed=0)
    batches = [[_traj([SEEN, NOVEL])], [_traj([NOVEL, "a third room"])]]
    rnd(batches[0])
    path = save_checkpoint(tmp_path, 1, model, tokenizer, {"rnd": rnd.state_dict()}, keep_last=1)
    expected = rnd(batches[1])
    restored = RNDBonus(CFG, seed=123)  # other initial nets: everything must come from the checkpoint
    assert load_trainer_state(path, {"rnd": restored}) == 1
    for a, b in zip(restored(batches[1]), expected):
        np.testing.assert_array_equal(a, b)
