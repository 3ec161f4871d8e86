"""The reflection request and the tips built from it (memory_service/service.py)."""

from __future__ import annotations

from memory_service.config import MemoryServiceConfig
from memory_service.service import reflection_messages, tip_text
from protocol.messages import EpisodeReport

REPORT = EpisodeReport(
    episode_id="e",
    task="find-animal",
    variation=0,
    task_description="Find an animal.",
    score=25.0,
    observations=["hallway", "kitchen", "garden"],
    actions=["go kitchen", "go garden", "focus on bee"],
)


def test_default_prompt_shows_task_steps_score_and_instruction():
    system, user = reflection_messages(REPORT, MemoryServiceConfig())
    assert system == {"role": "system", "content": MemoryServiceConfig().reflection_system}
    assert user["role"] == "user"
    text = user["content"]
    assert text.startswith("Task: Find an animal.")
    assert "1. state: 'hallway' -> action: go kitchen" in text and "3. state: 'garden' -> action: focus on bee" in text
    assert "Final score: 25/100." in text and text.endswith(MemoryServiceConfig().reflection_instruction)


def test_prompt_comes_from_config():
    cfg = MemoryServiceConfig(reflection_system="S.", reflection_instruction="Say one thing.", reflection_steps_shown=1)
    system, user = reflection_messages(REPORT, cfg)
    assert system["content"] == "S."
    assert "hallway" not in user["content"] and "1. state: 'garden' -> action: focus on bee" in user["content"]
    assert user["content"].endswith("Say one thing.")


def test_tip_names_the_action_and_the_final_score():
    assert (
        tip_text("  Look in the garden first. ", "go garden", 25.0)
        == "Look in the garden first. The action you took was go garden; eventually you got score 25/100."
    )
