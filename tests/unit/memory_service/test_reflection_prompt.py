"""The reflection request and the tips built from it (memory_service/service.py): the whole episode
as a chat (the reference's), the knobs that shorten it, and the token budget that trims the oldest
steps first, measured with the real tokenizer of the embedded model."""

from __future__ import annotations

import pytest

from memory_service.config import MemoryServiceConfig
from memory_service.service import reflection_messages, reflection_prompt, tip_text
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


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from common.model_prep import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("embedded:SmolLM2-135M-Instruct"))


def test_the_defaults_are_the_reference_whole_episode_at_the_rollout_temperature():
    cfg = MemoryServiceConfig()
    assert (cfg.reflection_steps_shown, cfg.reflection_state_chars, cfg.reflection_prompt_tokens) == (0, 0, 0)
    assert (cfg.reflection_max_tokens, cfg.reflection_temperature) == (128, 1.0)
    assert cfg.reflection_prompt_budget(2048) == 2048 - 128


def test_default_prompt_is_the_whole_episode_as_a_chat_then_score_and_instruction():
    cfg = MemoryServiceConfig()
    messages = reflection_messages(REPORT, cfg)
    assert messages == [
        {"role": "system", "content": cfg.reflection_system},
        {"role": "user", "content": "Task: Find an animal.\n\nhallway"},
        {"role": "assistant", "content": "go kitchen"},
        {"role": "user", "content": "kitchen"},
        {"role": "assistant", "content": "go garden"},
        {"role": "user", "content": "garden"},
        {"role": "assistant", "content": "focus on bee"},
        {"role": "user", "content": f"The attempt ended with the final score 25/100.\n\n{cfg.reflection_instruction}"},
    ]


def test_states_are_shown_in_full_unless_capped():
    long = EpisodeReport(**{**REPORT.__dict__, "observations": ["x" * 500, "kitchen", "garden"]})
    assert "x" * 500 in reflection_messages(long, MemoryServiceConfig())[1]["content"]
    capped = reflection_messages(long, MemoryServiceConfig(reflection_state_chars=10))
    assert capped[1]["content"] == "Task: Find an animal.\n\n" + "x" * 10


def test_prompt_comes_from_config_and_the_last_n_steps_say_what_is_left_out():
    cfg = MemoryServiceConfig(reflection_system="S.", reflection_instruction="Say one thing.", reflection_steps_shown=1)
    system, user, assistant, closing = reflection_messages(REPORT, cfg)
    assert system["content"] == "S."
    assert user["content"] == "Task: Find an animal.\n\n(The first 2 of the attempt's 3 steps are not shown.)\n\ngarden"
    assert assistant["content"] == "focus on bee"
    assert closing["content"].endswith("Say one thing.")


def test_skipping_every_step_keeps_the_task_and_the_score():
    system, closing = reflection_messages(REPORT, MemoryServiceConfig(), skip=5)
    assert closing["content"].startswith("Task: Find an animal.\n\n(The first 3 of the attempt's 3 steps")
    assert "final score 25/100" in closing["content"]


def _long_report(steps: int) -> EpisodeReport:
    return EpisodeReport(
        episode_id="e",
        task="boil",
        variation=0,
        task_description="Your task is to boil water.",
        score=-100.0,
        observations=[
            f"step {i}: This room is called the kitchen. In it, you see: a stove, a sink." for i in range(steps)
        ],
        actions=[f"look at stove {i}" for i in range(steps)],
    )


def test_a_prompt_within_its_budget_is_sent_whole(tokenizer):
    ids, dropped = reflection_prompt(REPORT, MemoryServiceConfig(), tokenizer, 10_000)
    assert dropped == 0
    text = tokenizer.decode(ids.tolist())
    assert all(o in text for o in REPORT.observations) and text.endswith("<|im_start|>assistant\n")


def test_an_episode_over_the_budget_loses_its_oldest_steps_first(tokenizer):
    report, cfg = _long_report(100), MemoryServiceConfig()
    whole, _ = reflection_prompt(report, cfg, tokenizer, 100_000)
    budget = len(whole) // 3
    ids, dropped = reflection_prompt(report, cfg, tokenizer, budget)
    assert len(ids) <= budget < len(reflection_prompt(report, cfg, tokenizer, 100_000)[0])
    text = tokenizer.decode(ids.tolist())
    # the newest steps, the task and the score are there; the oldest are not, and the prompt says so
    assert "step 99:" in text and f"step {dropped}:" in text and f"step {dropped - 1}:" not in text
    assert "Your task is to boil water." in text and "final score -100/100" in text
    assert f"(The first {dropped} of the attempt's 100 steps are not shown.)" in text
    # the fewest steps dropped: one more step would not fit
    one_more = tokenizer.apply_chat_template(
        reflection_messages(report, cfg, dropped - 1), tokenize=False, add_generation_prompt=True
    )
    assert len(tokenizer(one_more, add_special_tokens=False)["input_ids"]) > budget


def test_tip_names_the_action_and_the_final_score():
    assert (
        tip_text("  Look in the garden first. ", "go garden", 25.0)
        == "Look in the garden first. The action you took was go garden; eventually you got score 25/100."
    )
