"""HeRL's guidance block (actors/env_actor/prompts.py): exactly the unmet subgoals as what is still to
do, the met ones as achieved, with the task description and the attempt's last actions."""

from __future__ import annotations

from actors.env_actor.prompts import GUIDANCE_ACTIONS_SHOWN, format_guidance_block
from common.scienceworld import parse_goal_progress
from tests.unit.common.test_goal_progress import RECORDED


def test_the_guidance_lists_the_false_lines_as_still_to_do():
    task = "Your task is to find a(n) living thing. First, focus on the thing. Then, move it to the purple box."
    actions = [f"look around {i}" for i in range(12)]
    block = format_guidance_block(task, parse_goal_progress(RECORDED), actions)
    lines = block.strip().splitlines()
    assert lines[0] == "<guidance>An earlier attempt at this task fell short. What it achieved and what it missed:"
    assert lines[1] == f"Task: {task}"
    assert lines[2] == "Achieved: Be in a room with an open door"
    assert lines[3] == (
        "Still to do: focus on a living thing; move living thing to answer box; Pick up object; "
        "Move to a new location; Move to the location of the answer box"
    )
    assert lines[4] == f"Its last {GUIDANCE_ACTIONS_SHOWN} actions: " + ", ".join(actions[-GUIDANCE_ACTIONS_SHOWN:])
    assert lines[-1] == "</guidance>"
