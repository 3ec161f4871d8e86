"""The exploration metrics (learner/exploration.py) on a hand-made batch of three groups whose
distinct states, distinct actions and collapse are counted by hand below; the learner's step record
and gauges carry them, and the policy's entropy is measured at every step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.metrics import LearnerMetrics
from learner.config import LearnerConfig
from learner.exploration import METRICS, episode_states, exploration_stats, state_key
from learner.samples import TurnSample
from learner.step import StepContext, StepStats, StepTotals, train_step
from learner.train import step_record
from learner.weight_push import PushTiming
from protocol.messages import ON_POLICY, Trajectory, TurnRecord
from testing.factories import tiny_llama


def look(room: str, *objects: str) -> str:
    """A state as the env actor shows it: feedback, then ScienceWorld's look text."""
    seen = "".join(f"\n\t{o}" for o in objects)
    return f"You did something.\nThis room is called the {room}. In it, you see: {seen}\nYou also see:\n\tA door"


KC = look("kitchen", "the agent", "a fridge. The fridge door is closed.", "an apple")  # kitchen, fridge closed
KO = look("kitchen", "the agent", "a fridge. The fridge door is open.", "an apple")  # the same, fridge open
H = look("hallway", "the agent", "a picture")
ORANGE, BOTH = "In your inventory, you see:\n\tan orange", "In your inventory, you see:\n\tan orange\n\tan apple"


def episode(group: str, slot: int, turns: list[tuple[str, str, str]], start_inventory: str = ORANGE) -> Trajectory:
    """turns: (observation the action was chosen on, action, inventory after the action)."""
    records = [
        TurnRecord(np.array([1]), np.array([2]), np.array([-0.1]), obs, action, location="", inventory=inventory)
        for obs, action, inventory in turns
    ]
    ids = dict(episode_id=f"{group}-{slot}", group_id=group, slot=slot, actor_id="a", task="t", variation=0)
    return Trajectory.from_turns(records, **ids, mode=ON_POLICY, score=0.0, done=True, start_inventory=start_inventory)


BATCH = [
    # g1: three different paths. States: KC+orange, KO+orange, H+orange -> 3 in the group; 5 actions
    episode("g1", 0, [(KC, "open fridge", ORANGE), (KO, "pick up apple", BOTH)]),  # KC, KO: 2
    episode("g1", 1, [(KC, "look around", ORANGE)] * 3),  # KC: 1
    episode("g1", 2, [(KC, "go to hallway", ORANGE), (H, "go to kitchen", ORANGE), (KC, "look around", ORANGE)]),  # 2
    # g2: two episodes on one path (collapsed): KC+orange, 1 state, 1 action
    episode("g2", 0, [(KC, "look around", ORANGE)] * 2),
    episode("g2", 1, [(KC, "look around", ORANGE)] * 2),
    # g3: one episode (not judged for collapse); the same look with another inventory is another state: 2 states
    episode("g3", 0, [(KC, "pick up apple", BOTH), (KC, "look around", BOTH)]),
]


def test_the_metrics_of_a_hand_counted_batch():
    stats = exploration_stats(BATCH)
    assert set(stats) == {*METRICS, "score_by_strategy_temperature"}
    assert stats["strategies_per_episode"] is None and stats["score_by_strategy_temperature"] == {}  # no SGE
    assert stats["distinct_states_per_episode"] == pytest.approx((2 + 1 + 2 + 1 + 1 + 2) / 6)
    assert stats["distinct_states_per_group"] == pytest.approx((3 + 1 + 2) / 3)
    assert stats["distinct_actions_per_group"] == pytest.approx((5 + 1 + 2) / 3)
    assert stats["collapsed_group_fraction"] == pytest.approx(1 / 2)  # g2 of g1, g2


def test_a_state_is_the_room_the_inventory_and_the_visible_objects():
    g3 = episode_states(BATCH[-1])
    assert g3[0] != g3[1]  # the same look, the inventory before turn 1 holds the apple
    assert episode_states(BATCH[0])[0] == episode_states(BATCH[1])[0]  # the same start
    assert state_key("kitchen", ORANGE, ["a", "b"]) == state_key("kitchen", ORANGE + "\n", ["b", "a"])
    assert state_key("kitchen", ORANGE, ["a"]) != state_key("hallway", ORANGE, ["a"])


def test_a_record_without_inventories_hashes_room_and_objects_only():
    old = episode("g3", 0, [(KC, "pick up apple", ""), (KC, "look around", "")], start_inventory="")
    assert len(set(episode_states(old))) == 1
    assert exploration_stats([old])["collapsed_group_fraction"] is None  # a group of one


def test_an_empty_batch_has_no_values():
    assert exploration_stats([]) == {**dict.fromkeys(METRICS), "score_by_strategy_temperature": {}}


def test_sge_strategies_are_counted_per_episode_and_group_and_scores_by_strategy_temperature():
    batch = [episode("g1", i, [(KC, "look around", ORANGE)] * 2) for i in range(3)]
    for t, strategies, temperature, score in zip(
        batch, (["go to kitchen", ""], ["go to kitchen", "open fridge"], ["", ""]), (0.6, 1.0, 1.4), (10, 30, 50)
    ):
        t.strategies, t.strategy_temperature, t.score = strategies, temperature, score
    stats = exploration_stats(batch)
    assert stats["strategies_per_episode"] == pytest.approx((1 + 2 + 0) / 3)
    assert stats["distinct_strategies_per_group"] == 2
    assert stats["score_by_strategy_temperature"] == {"0.60": 10, "1.00": 30, "1.40": 50}


# ------------------------------------------------------------------ the step record and the entropy


def test_the_step_record_carries_them_and_the_gauges_export_them():
    stats = StepStats.from_totals(StepTotals(), [], lr=0.0)
    record = step_record(1, BATCH, stats, {}, step_s=1.0, push=PushTiming(seconds=0.0, engine_seconds=0.0))
    assert {name: record[name] for name in METRICS} == {k: exploration_stats(BATCH)[k] for k in METRICS}
    metrics = LearnerMetrics()
    metrics.observe_step({**record, "score_by_strategy_temperature": {"0.60": 12.5}})
    assert metrics.registry.get_sample_value(
        "empo2_learner_score_by_strategy_temperature", {"temperature": "0.60"}
    ) == pytest.approx(12.5)
    for name in [n for n in METRICS if record[n] is not None]:
        assert metrics.registry.get_sample_value(f"empo2_learner_{name}") == pytest.approx(record[name])
    metrics.observe_step({**record, "collapsed_group_fraction": None})  # no group of two: the gauge keeps its value
    assert metrics.registry.get_sample_value("empo2_learner_collapsed_group_fraction") == pytest.approx(0.5)


def _sample(advantage: float) -> TurnSample:
    prompt = np.array([1, 2, 3, 4, 5], np.int32)
    return TurnSample(
        update_prompt=prompt,
        tipfree_prompt=prompt,
        response=np.array([6, 7, 8], np.int32),
        behaviour_logp=np.full(3, -3.0, np.float32),
        advantage=advantage,
        mode=ON_POLICY,
        policy_version=0,
        with_tips=False,
    )


def test_the_entropy_is_measured_at_every_step_and_is_in_the_loss_only_with_entropy_coef():
    """Without entropy_coef the policy's entropy is measured all the same, outside the loss; with it, it is
    the same number (the same forward, before the optimizer step), subtracted in the loss."""
    vocab, coef = 32, 0.5
    samples = [_sample(1.0), _sample(-1.0)]
    stats = []
    for entropy_coef in (0.0, coef):
        model = tiny_llama(vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        stats.append(train_step(StepContext(model, optimizer, samples, LearnerConfig(entropy_coef=entropy_coef), 0)))
    measured, in_loss = stats
    assert 0.0 < measured.entropy_mean <= np.log(vocab) + 1e-4
    assert measured.entropy_mean == pytest.approx(in_loss.entropy_mean, rel=1e-5)
    assert measured.loss - in_loss.loss == pytest.approx(coef * measured.entropy_mean, rel=1e-4)
