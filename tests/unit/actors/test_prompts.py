"""PromptBuilder (actors/prompts.py) with the real tokenizer of the embedded SmolLM2 model: the
system part (task, demonstration, templates), the episode as a chat whose user turns keep their
tips, tip spans that cover exactly the tip blocks (several per prompt), the learner's span removal
giving exactly the tip-free prompt, and the token budget trimming the oldest turns first."""

from __future__ import annotations

import numpy as np
import pytest

from actors.prompts import (
    INSTRUCTIONS,
    TIP_HEADER,
    ChatTurn,
    Demonstration,
    PromptBuilder,
    TaskContext,
    format_tip_block,
    system_message,
)
from learner.samples import remove_spans

CTX = TaskContext(
    task="Your task is to find a(n) living thing.",
    demonstration=Demonstration(
        3, "Your task is to find a(n) living thing.", ["open door to kitchen", "go to kitchen", "focus on apple"]
    ),
    action_templates=["open OBJ", "go to OBJ", "focus on OBJ", "look around"],
)
STATE = "This room is called the kitchen. In it, you see: a counter, an apple, a fridge."
PAST = [
    ChatTurn("This room is called the hallway.", ["Try the kitchen.", "Doors must be opened."], "open door to kitchen"),
    ChatTurn("The door is now open.", [], "go to kitchen"),
    ChatTurn("You move to the kitchen.", ["Apples are living things."], "look around"),
]
TIPS = [
    "Look in the greenhouse first; plants are living things.",
    "The action you took was go to outside; eventually you got score 75/100.",
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from common.model_prep import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("embedded:SmolLM2-135M-Instruct"))


@pytest.fixture(scope="module")
def builder(tokenizer):
    return PromptBuilder(tokenizer, history_window=0, token_budget=100_000)


def _encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_format_tip_block():
    assert format_tip_block(["a.", "b."]) == f"\n<tip>{TIP_HEADER}\n1. a.\n2. b.\n</tip>"


def test_system_message_has_the_task_the_demonstration_and_the_templates():
    text = system_message(CTX)
    assert text.startswith(INSTRUCTIONS)
    assert "Task: Your task is to find a(n) living thing." in text
    assert "> open door to kitchen\n> go to kitchen\n> focus on apple" in text
    assert "open OBJ\ngo to OBJ\nfocus on OBJ\nlook around" in text
    assert text.index("Task:") < text.index("> open door") < text.index("open OBJ\n")
    bare = system_message(TaskContext("Do it."))
    assert bare == f"{INSTRUCTIONS}\n\nTask: Do it."


def test_without_tips_no_spans_and_ids_match_rendered_text(builder, tokenizer):
    p = builder.build(CTX, [ChatTurn(t.state, [], t.action) for t in PAST], STATE, [])
    assert p.tip_spans == [] and p.turns_dropped == 0
    assert p.token_ids.dtype == np.int32 and p.token_ids.ndim == 1
    assert p.token_ids.tolist() == _encode(tokenizer, p.text)
    assert "<tip>" not in p.text
    assert p.text.endswith("<|im_start|>assistant\n")  # generation prompt


def test_the_episode_is_a_chat_whose_user_turns_keep_their_tips(builder, tokenizer):
    p = builder.build(CTX, PAST, STATE, TIPS)
    text = p.text
    expected = (
        f"<|im_start|>system\n{system_message(CTX)}<|im_end|>\n"
        f"<|im_start|>user\n{PAST[0].state}{format_tip_block(PAST[0].tips)}<|im_end|>\n"
        f"<|im_start|>assistant\n{PAST[0].action}<|im_end|>\n"
        f"<|im_start|>user\n{PAST[1].state}<|im_end|>\n"
        f"<|im_start|>assistant\n{PAST[1].action}<|im_end|>\n"
        f"<|im_start|>user\n{PAST[2].state}{format_tip_block(PAST[2].tips)}<|im_end|>\n"
        f"<|im_start|>assistant\n{PAST[2].action}<|im_end|>\n"
        f"<|im_start|>user\n{STATE}{format_tip_block(TIPS)}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text == expected
    # one span per tip block shown, in order, each decoding to exactly its block
    assert len(p.tip_spans) == 3
    blocks = [format_tip_block(PAST[0].tips), format_tip_block(PAST[2].tips), format_tip_block(TIPS)]
    for (s, e), block in zip(p.tip_spans, blocks):
        assert tokenizer.decode(p.token_ids[s:e].tolist()) == block
        assert p.token_ids[s:e].tolist() == _encode(tokenizer, block)
    assert [s for s, _ in p.tip_spans] == sorted(s for s, _ in p.tip_spans)


def test_removing_every_span_gives_exactly_the_tip_free_prompt(builder, tokenizer):
    """What the off-policy update scores: learner.samples.remove_spans with the turn's spans."""
    with_tips = builder.build(CTX, PAST, STATE, TIPS)
    without = builder.build(CTX, [ChatTurn(t.state, [], t.action) for t in PAST], STATE, [])
    stripped = remove_spans(with_tips.token_ids, with_tips.tip_spans)
    np.testing.assert_array_equal(stripped, without.token_ids)
    rest = tokenizer.decode(stripped.tolist())
    assert "<tip>" not in rest and TIP_HEADER not in rest and all(t not in rest for t in TIPS + PAST[0].tips)


def test_history_window_keeps_the_last_n_turns_and_says_so(tokenizer):
    p = PromptBuilder(tokenizer, history_window=1, token_budget=100_000).build(CTX, PAST, STATE, [])
    assert p.turns_dropped == 2
    assert PAST[0].state not in p.text and PAST[1].action not in p.text.split("<|im_start|>user")[-2]
    assert f"<|im_start|>user\n(2 earlier steps are not shown.)\n{PAST[2].state}" in p.text


def test_the_budget_drops_the_oldest_turns_first_and_never_the_system_or_current_turn(builder, tokenizer):
    whole = builder.build(CTX, PAST, STATE, TIPS)
    no_history = len(builder._render(CTX, [], STATE, TIPS, len(PAST)).token_ids)
    for budget in range(len(whole.token_ids) - 1, no_history - 1, -7):
        p = PromptBuilder(tokenizer, history_window=0, token_budget=budget).build(CTX, PAST, STATE, TIPS)
        kept = PAST[p.turns_dropped :]
        assert not p.demonstration_dropped
        assert system_message(CTX) in p.text and p.text.endswith(
            f"{STATE}{format_tip_block(TIPS)}<|im_end|>\n<|im_start|>assistant\n"
        )
        assert all(f"<|im_start|>assistant\n{t.action}<|im_end|>" in p.text for t in kept)
        assert all(f"<|im_start|>assistant\n{t.action}<|im_end|>" not in p.text for t in PAST[: p.turns_dropped])
        if p.turns_dropped < len(PAST):
            assert len(p.token_ids) <= budget
        if p.turns_dropped:  # the fewest turns dropped: keeping one more would not fit
            d = p.turns_dropped - 1
            assert len(builder._render(CTX, PAST[d:], STATE, TIPS, d).token_ids) > budget
        # the spans still cover exactly the tip blocks kept
        shown = [t.tips for t in kept if t.tips] + [TIPS]
        assert [tokenizer.decode(p.token_ids[s:e].tolist()) for s, e in p.tip_spans] == [
            format_tip_block(t) for t in shown
        ]
    tiny = PromptBuilder(tokenizer, history_window=0, token_budget=1).build(CTX, PAST, STATE, TIPS)
    assert tiny.turns_dropped == len(PAST) and STATE in tiny.text  # nothing fits: the system and the current turn
    assert tiny.demonstration_dropped and system_message(TaskContext(CTX.task, None, CTX.action_templates)) in tiny.text


def test_a_demonstration_that_leaves_no_room_goes_and_the_turns_are_fitted_without_it(builder, tokenizer):
    """A long gold sequence (a task's demonstration was 2450 tokens against a 2048-token context):
    past the budget even without past turns, the demonstration is left out and as many turns as fit
    without it are kept."""
    no_demo = TaskContext(CTX.task, None, CTX.action_templates)
    long_demo = TaskContext(CTX.task, Demonstration(3, CTX.task, ["look around"] * 400), CTX.action_templates)
    budget = len(builder.build(no_demo, PAST, STATE, TIPS).token_ids)  # the whole episode fits without it
    assert len(builder._render(long_demo, [], STATE, TIPS, len(PAST)).token_ids) > budget
    p = PromptBuilder(tokenizer, history_window=0, token_budget=budget).build(long_demo, PAST, STATE, TIPS)
    assert p.demonstration_dropped and p.turns_dropped == 0 and len(p.token_ids) <= budget
    assert p.text == builder.build(no_demo, PAST, STATE, TIPS).text


def test_observation_truncated_to_max_chars(tokenizer):
    long_state = "Q" * 50 + "Z" * 50
    p = PromptBuilder(tokenizer, 0, 100_000, max_observation_chars=50).build(TaskContext("t"), [], long_state, [])
    assert "<|im_start|>user\n" + "Q" * 50 + "<|im_end|>" in p.text and "Z" not in p.text
