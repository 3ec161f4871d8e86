"""The env actor's episode logic on a live ScienceWorld (a real JVM): generated text that is not a
valid action is mapped to the most similar valid action of the *current* state and the step
goes through, and per-task step limits end episodes. The policy is not under test here: the
generation function returns fixed texts (the real policy's path is the e2e test's)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from actors.env_actor.episode import open_episode_runner
from common.scienceworld import most_similar_action
from pipeline.cli import given
from pipeline.config import load_config
from protocol.messages import ON_POLICY, Assignment, GenerateResponse

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runner():
    cfg = load_config(["env.max_steps=3", "+env.max_steps_per_task.find-plant=2", "env.task_step_limits=true"])
    runner = open_episode_runner(**given("empo2-env-actor", cfg))
    yield runner
    runner.env.close()


def test_invalid_text_maps_to_a_valid_action_of_the_live_state(runner):
    env = runner.env
    state = env.reset("find-living-thing", 0)
    moves = [a for a in state.valid_actions if a.startswith("go to ")]
    assert moves, state.valid_actions[:20]
    target = moves[0]
    # what a small model writes: capitals, a prompt arrow, an extra word, a trailing sentence
    garbled = f"> {target.upper()} NOW.\nI think that is best."
    action, mapped = most_similar_action(garbled, state.valid_actions)
    assert mapped and action == target
    after = env.step(action)
    assert "No known action" not in after.observation and after.observation.strip()
    assert after.observation != state.observation

    # text with no word in common still yields an action of the current list, which the env accepts
    action, mapped = most_similar_action("qwerty zxcv", after.valid_actions)
    assert mapped and action in after.valid_actions
    assert "No known action" not in env.step(action).observation


def _look_around(prompt_ids: np.ndarray, seed: int) -> GenerateResponse:
    return GenerateResponse(
        request_id="r",
        token_ids=np.array([1, 2], np.int32),
        logprobs=np.array([-0.1, -0.2], np.float32),
        text="look around please",
        policy_version=0,
        finish_reason="stop",
    )


# find-plant: the override; find-living-thing: env.max_steps; chemistry-mix: the reference's default 60
@pytest.mark.parametrize("task, turns", [("find-plant", 2), ("find-living-thing", 3), ("chemistry-mix", 60)])
def test_per_task_step_limits(runner, task, turns):
    assignment = Assignment(group_id="g", slot=0, task=task, variation=0, mode=ON_POLICY, seed=1)
    trajectory, stats = runner.play(assignment, "actor-test", _look_around, lambda *a: None)
    assert trajectory.num_turns == turns and not trajectory.done
    assert trajectory.actions == ["look around"] * turns and stats.invalid_actions == turns


def test_the_env_step_limit_ends_an_episode_before_a_longer_task_limit():
    """env.env_step_limit is ScienceWorld's envStepLimit: the env reports done once an episode has
    taken more moves than it, whatever our per-task limit (here 120, the reference's for this task).
    Moves are the env's count, not turns: "look around" is free, "wait1" counts 2 in 1.2.3."""
    cfg = load_config(["env.task_step_limits=true", "env.env_step_limit=4"])
    assert cfg.env.step_limit("measure-melting-point-known-substance") == 120
    runner = open_episode_runner(**given("empo2-env-actor", cfg))
    try:
        assignment = Assignment(
            group_id="g", slot=0, task="measure-melting-point-known-substance", variation=0, mode=ON_POLICY, seed=1
        )
        trajectory, _ = runner.play(assignment, "actor-test", _wait, lambda *a: None)
    finally:
        runner.env.close()
    assert trajectory.actions[0] == "wait1"
    assert trajectory.done and trajectory.num_turns <= 5 and not trajectory.success


def _wait(prompt_ids: np.ndarray, seed: int) -> GenerateResponse:
    return dataclasses.replace(_look_around(prompt_ids, seed), text="wait1")


def test_the_cpu_profile_plays_4_steps_of_any_task():
    cfg = load_config([])
    runner = open_episode_runner(**given("empo2-env-actor", cfg))
    try:
        for task in ("find-living-thing", "boil"):
            assignment = Assignment(group_id="g", slot=0, task=task, variation=0, mode=ON_POLICY, seed=1)
            trajectory, _ = runner.play(assignment, "actor-test", _look_around, lambda *a: None)
            assert trajectory.num_turns == 4 and not trajectory.done
    finally:
        runner.env.close()


def test_a_live_episodes_goal_progress_parses_into_its_subgoals_with_the_right_flags(runner):
    """HeRL's rubrics (common/scienceworld.py, parse_goal_progress): at reset no sequential subgoal of
    find-living-thing is met; after a move to another room "Move to a new location" is."""
    from common.scienceworld import parse_goal_progress

    env = runner.env
    state = env.reset("find-living-thing", 0)
    start = parse_goal_progress(env.goal_progress())
    sequential = [s for s in start if s.sequential]
    assert sequential and sequential[0].description == "focus on a living thing"
    assert not any(s.passed for s in sequential)
    moved = {s.description: s.passed for s in start if not s.sequential}
    assert moved.get("Move to a new location") is False, start
    env.step(next(a for a in state.valid_actions if a.startswith("teleport to ")))  # the easy simplification's
    after = {s.description: s.passed for s in parse_goal_progress(env.goal_progress())}
    assert after["Move to a new location"] and not after["focus on a living thing"], after
