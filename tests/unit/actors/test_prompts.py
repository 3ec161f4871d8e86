"""PromptBuilder (actors/prompts.py) with the real tokenizer of the embedded SmolLM2 model."""

from __future__ import annotations

import numpy as np
import pytest

from actors.prompts import SYSTEM_PROMPT, TIP_HEADER, PromptBuilder, format_tip_block

TASK = "Your task is to find a(n) living thing."
STATE = "This room is called the kitchen. In it, you see: a counter, an apple, a fridge."
HISTORY = [
    ("open door to kitchen", "The door is now open."),
    ("go to kitchen", "You move to the kitchen."),
    ("look around", "This room is called the kitchen."),
    ("open fridge", "The fridge is now open."),
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
    return PromptBuilder(tokenizer, history_window=2)


def _encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_format_tip_block():
    block = format_tip_block(["a.", "b."])
    assert block == f"\n<tip>{TIP_HEADER}\n1. a.\n2. b.\n</tip>"


def test_without_tips_no_spans_and_ids_match_rendered_text(builder, tokenizer):
    p = builder.build(TASK, HISTORY, STATE, [])
    assert p.tip_spans == []
    assert p.token_ids.dtype == np.int32
    assert p.token_ids.ndim == 1
    assert p.token_ids.tolist() == _encode(tokenizer, p.text)
    assert "<tip>" not in p.text
    assert SYSTEM_PROMPT in p.text
    assert TASK in p.text and STATE in p.text
    assert p.text.endswith("<|im_start|>assistant\n")  # generation prompt


def test_with_tips_span_decodes_to_tip_block(builder, tokenizer):
    p = builder.build(TASK, HISTORY, STATE, TIPS)
    assert p.token_ids.dtype == np.int32
    assert len(p.tip_spans) == 1
    s, e = p.tip_spans[0]
    assert 0 < s < e < len(p.token_ids)
    decoded = tokenizer.decode(p.token_ids[s:e].tolist())
    assert "<tip>" in decoded and "</tip>" in decoded
    assert TIP_HEADER in decoded
    for tip in TIPS:
        assert tip in decoded
    assert decoded == format_tip_block(TIPS)
    # nothing of the tip block outside its span
    rest = tokenizer.decode(np.delete(p.token_ids, np.arange(s, e)).tolist())
    assert "<tip>" not in rest and "</tip>" not in rest and TIPS[0] not in rest


def test_removing_span_gives_exactly_the_no_tip_prompt(builder):
    with_tips = builder.build(TASK, HISTORY, STATE, TIPS)
    without = builder.build(TASK, HISTORY, STATE, [])
    s, e = with_tips.tip_spans[0]
    stripped = np.concatenate([with_tips.token_ids[:s], with_tips.token_ids[e:]])
    np.testing.assert_array_equal(stripped, without.token_ids)
    assert with_tips.text.replace(format_tip_block(TIPS), "") == without.text


def test_tip_block_is_in_user_turn_before_generation_prompt(builder, tokenizer):
    p = builder.build(TASK, HISTORY, STATE, TIPS)
    text = p.text
    user = text.index("<|im_start|>user")
    tip_open, tip_close = text.index("<tip>"), text.index("</tip>")
    assistant = text.index("<|im_start|>assistant")
    assert user < text.index("What is your next action?") < tip_open < tip_close < assistant
    # the user turn ends right after the tip block
    assert text[tip_close:].startswith("</tip><|im_end|>")
    # at the token level: the span ends where the end of the user turn begins
    s, e = p.tip_spans[0]
    after = tokenizer.decode(p.token_ids[e:].tolist())
    assert after.startswith("<|im_end|>")
    assert after.endswith("<|im_start|>assistant\n")
    before = tokenizer.decode(p.token_ids[:s].tolist())
    assert before.endswith("What is your next action?")


def test_history_window_keeps_last_n_pairs(tokenizer):
    p = PromptBuilder(tokenizer, history_window=2).build(TASK, HISTORY, STATE, [])
    assert "> open door to kitchen" not in p.text
    assert "> go to kitchen" not in p.text
    assert "The door is now open." not in p.text
    assert "> look around\nThis room is called the kitchen." in p.text
    assert "> open fridge\nThe fridge is now open." in p.text
    assert p.text.index("> look around") < p.text.index("> open fridge")


def test_history_window_larger_than_history_keeps_all(tokenizer):
    p = PromptBuilder(tokenizer, history_window=10).build(TASK, HISTORY, STATE, [])
    for action, obs in HISTORY:
        assert f"> {action}\n{obs}" in p.text


def test_history_window_zero_and_empty_history_have_no_history_section(tokenizer):
    for builder, history in (
        (PromptBuilder(tokenizer, history_window=0), HISTORY),
        (PromptBuilder(tokenizer, history_window=4), []),
    ):
        p = builder.build(TASK, history, STATE, [])
        assert "Your most recent actions" not in p.text
        assert "> " not in p.text


def test_observation_truncated_to_max_chars(tokenizer):
    long_state = "Q" * 50 + "Z" * 50
    p = PromptBuilder(tokenizer, history_window=0, max_observation_chars=50).build(TASK, [], long_state, [])
    assert "Current state:\n" + "Q" * 50 + "\n\nWhat is your next action?" in p.text
    assert "Z" not in p.text


def test_single_tip_and_different_tips_give_different_spans(builder, tokenizer):
    one = builder.build(TASK, HISTORY, STATE, TIPS[:1])
    two = builder.build(TASK, HISTORY, STATE, TIPS)
    (s1, e1), (s2, e2) = one.tip_spans[0], two.tip_spans[0]
    assert s1 == s2  # the block starts at the same place
    assert e2 > e1
    assert tokenizer.decode(one.token_ids[s1:e1].tolist()) == format_tip_block(TIPS[:1])
