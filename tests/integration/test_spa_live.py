"""SPA's data on a live ScienceWorld (a real JVM) with the real tokenizer: an episode played in the
world-model turn format through the env actor's own episode logic (a scripted policy writes the turns;
the real policy's path is the collection's) is recorded with the true state before and after every
action, the SFT sequence built from it holds one row per turn whose observation is the env's state at t
and whose prediction is its state at t+1, and the collection plays training variations only."""

from __future__ import annotations

import numpy as np
import pytest

from actors.env_actor.episode import open_episode_runner
from actors.env_actor.prompts import PromptBuilder, TaskContext
from actors.env_actor.turn_format import WORLD_MODEL_INSTRUCTIONS, tagged, world_model
from common.scienceworld import room_of
from pipeline.cli import given
from pipeline.config import load_config
from protocol.messages import ON_POLICY, Assignment, GenerateResponse
from spa.collect import episode_record, plan
from spa.states import CollectedTurn, episode_sequence, inventory_items

pytestmark = pytest.mark.integration
TASK = "find-living-thing"
ACTIONS = ["teleport to hallway", "look around", "teleport to kitchen"]  # the easy simplification teleports


@pytest.fixture(scope="module")
def runner():
    runner = open_episode_runner(
        **given("empo2-env-actor", load_config(["env.max_steps=3"])), turn_format=world_model(160)
    )
    yield runner
    runner.env.close()


def test_a_live_world_model_episode_gives_rows_with_the_true_states(runner):
    tokenizer = runner.prompts.tokenizer
    turns = iter(ACTIONS)

    def generate(prompt_ids: np.ndarray, seed: int) -> GenerateResponse:
        text = f"<think><observation>a room</observation> move on. <prediction>another room</prediction></think><answer>{next(turns)}"
        ids = tokenizer(text + "</answer>", add_special_tokens=False)["input_ids"]  # vLLM keeps the stop's tokens
        return GenerateResponse("r", np.array(ids, np.int32), np.full(len(ids), -0.1, np.float32), text, 0, "stop")

    train = runner.env.train_variations(TASK)
    a = Assignment(group_id="spa-0", slot=0, task=TASK, variation=train[0], mode=ON_POLICY, seed=0)
    trajectory, stats = runner.play(a, "actor-test", generate, lambda *_: ([], 0))
    assert trajectory.actions == ACTIONS  # the <answer> is the action (valid ones: not mapped)
    episode = type(
        "Episode", (), {"trajectory": trajectory, "stats": stats, "task_description": runner.env.task_description}
    )
    record = episode_record(a, episode, runner)
    rows = record["turns"]
    assert len(rows) == trajectory.num_turns == 3
    for t, row in enumerate(rows):
        after_room, after_inventory = trajectory.locations[t], trajectory.inventories[t]
        assert row["next"].endswith(f"Location: {after_room}. Inventory: {inventory_items(after_inventory)}.")
        assert stats.feedbacks[t].strip().splitlines()[0] in row["next"]
        if t + 1 < len(rows):  # the state at t+1 is the one after turn t
            assert row["next"].endswith(rows[t + 1]["current"])
            assert room_of(trajectory.observations[t + 1]) == after_room
    assert rows[0]["current"].startswith(f"Location: {room_of(trajectory.observations[0])}.")
    assert trajectory.locations == ["hallway", "hallway", "kitchen"]  # the env moved: what the predictions carry
    # the SFT sequence: a row per turn, its observation the state at t, its prediction the state at t+1
    builder = PromptBuilder(tokenizer, 0, 1888)
    ctx = TaskContext(
        record["task_description"], None, record["action_templates"], format_instructions=WORLD_MODEL_INSTRUCTIONS
    )
    seq = episode_sequence(builder, ctx, [CollectedTurn(**row) for row in rows], 2048, True)
    assert seq.rows == 3
    for (start, length), row in zip(seq.spans, rows):
        text = tokenizer.decode(seq.tokens[start : start + length].tolist())
        assert tagged(text, "observation") == row["current"] and tagged(text, "prediction") == row["next"]
    assert "<|im_start|>assistant" not in tokenizer.decode(
        [tok for i, tok in enumerate(seq.tokens.tolist()) if any(s <= i < s + n for s, n in seq.spans)]
    )  # the loss covers the assistant's turns only


def test_the_collection_plays_training_variations_only(runner):
    env = runner.env
    train, test = env.train_variations(TASK), env.test_variations(TASK)
    assignments = plan([TASK], {TASK: train[:5]}, 12)
    assert {a.variation for a in assignments} <= set(train[:5]) and not {a.variation for a in assignments} & set(test)
