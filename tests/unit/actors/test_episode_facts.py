"""The env actor records the environment's facts in the trajectory (issue 22, item 6): after each
turn's action the room and the inventory, at reset the inventory, at the end the goal progress; texts
over their bounds are cut. Against a scripted stand-in for ScienceWorld (no JVM, no tokenizer)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from actors.env_actor.episode import EpisodeRunner
from common.scienceworld import StepResult
from protocol import decode, encode
from protocol.messages import MAX_GOAL_PROGRESS_CHARS, MAX_INVENTORY_CHARS, ON_POLICY, Assignment, GenerateResponse

# (location, inventory) after each action; the last action ends the episode
AFTER = [("hallway", "an orange"), ("kitchen", "an orange"), ("kitchen", "an orange, an apple")]


class WalkingEnv:
    """Starts in the hallway holding an orange; each step moves along AFTER."""

    task_description = "Your task is to find an apple."

    def __init__(self, goal_progress: str = "0\ttrue\tGoalMoveToNewLocation"):
        self.steps, self.progress = 0, goal_progress

    def train_variations(self, task: str) -> list[int]:
        return [0, 1]

    def action_templates(self) -> list[str]:
        return ["go to LOC", "pick up OBJ"]

    def reset(self, task: str, variation: int) -> StepResult:
        self.steps = 0
        return StepResult("hallway", "hallway", 0.0, False, ["go to kitchen"], "hallway", "an orange")

    def step(self, action: str) -> StepResult:
        location, inventory = AFTER[self.steps]
        self.steps += 1
        done = self.steps == len(AFTER)
        return StepResult(action, location, 10.0 * self.steps, done, ["go to kitchen"], location, inventory)

    def goal_progress(self) -> str:
        return self.progress


class OneTokenPrompts:
    """Stands in for actors.env_actor.prompts.PromptBuilder: every prompt two tokens, its own chain."""

    def chat(self, ctx):
        return self

    def prompt(self, state, tips, note=""):
        return SimpleNamespace(token_ids=np.array([1, 2], np.int32), tip_spans=[], chain_start=True, tips=list(tips))

    def answered(self, state, tips, note, response_ids):
        pass


def _play(env: WalkingEnv):
    def generate(ids, seed):
        return GenerateResponse("r", np.array([7], np.int32), np.array([-0.5], np.float32), "go to kitchen", 0, "stop")

    a = Assignment(group_id="g", slot=0, task="find-apple", variation=1, mode=ON_POLICY, seed=0)
    return EpisodeRunner(env, OneTokenPrompts(), max_steps=10).play(a, "actor-0", generate, lambda *q: None)[0]


def test_the_facts_after_each_action_at_reset_and_at_the_end_are_recorded():
    trajectory = decode(encode(_play(WalkingEnv())))
    assert trajectory.num_turns == 3
    assert trajectory.locations == ["hallway", "kitchen", "kitchen"]
    assert trajectory.inventories == ["an orange", "an orange", "an orange, an apple"]
    assert trajectory.start_inventory == "an orange"
    assert trajectory.goal_progress == "0\ttrue\tGoalMoveToNewLocation"


def test_texts_over_their_bounds_are_cut():
    class LongTexts(WalkingEnv):
        def step(self, action: str) -> StepResult:
            result = super().step(action)
            result.inventory *= MAX_INVENTORY_CHARS
            return result

    trajectory = _play(LongTexts(goal_progress="g" * (MAX_GOAL_PROGRESS_CHARS + 10)))
    trajectory.validate()
    assert [len(i) for i in trajectory.inventories] == [MAX_INVENTORY_CHARS] * 3
    assert len(trajectory.goal_progress) == MAX_GOAL_PROGRESS_CHARS
