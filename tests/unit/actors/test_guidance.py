"""HeRL's guidance block in a guided episode's prompt (actors/env_actor/prompts.py)."""

from __future__ import annotations

from actors.env_actor.prompts import GUIDANCE_HEADER, format_guidance_block


def test_the_block_wraps_the_guidance_with_the_task_description():
    block = format_guidance_block("Your task is to find a(n) living thing.", "It missed: focus on a living thing")
    assert block == (
        f"\n<guidance>{GUIDANCE_HEADER}\nTask: Your task is to find a(n) living thing.\n"
        "It missed: focus on a living thing\n</guidance>"
    )
