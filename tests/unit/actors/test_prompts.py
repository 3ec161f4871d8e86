"""PromptBuilder and Chat (actors/env_actor/prompts.py) with the real tokenizer of the embedded SmolLM2 model:
the system part (task, demonstration, templates), the episode as a token chain whose user turns keep
their tips and whose responses are the generated tokens, one end-of-turn whatever the response ended
with, tip spans that cover exactly the tip blocks (several per prompt), the learner's span removal
giving exactly the tip-free prompt, and the token budget trimming half the history at once."""

from __future__ import annotations

import numpy as np
import pytest

from actors.env_actor.prompts import (
    INSTRUCTIONS,
    TIP_HEADER,
    Demonstration,
    PromptBuilder,
    TaskContext,
    executed_note,
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
# (state, tips, generated response text) of three past turns
PAST = [
    ("This room is called the hallway.", ["Try the kitchen.", "Doors must be opened."], "open door to kitchen"),
    ("The door is now open.", [], "go to kitchen"),
    ("You move to the kitchen.", ["Apples are living things."], "look around"),
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


def _play(builder, tokenizer, past, state, tips, ctx=CTX, eos=False):
    """The chat through `past` (each response generated as its text, + the end-of-sequence token if
    `eos`), then the prompt of `state`: [each turn's prompt], the chat."""
    chat = builder.chat(ctx)
    prompts = []
    for turn_state, turn_tips, text in past:
        prompts.append(chat.prompt(turn_state, turn_tips))
        response = np.asarray(_encode(tokenizer, text) + ([tokenizer.eos_token_id] if eos else []), np.int32)
        chat.answered(turn_state, prompts[-1].tips, "", response)
    prompts.append(chat.prompt(state, tips))
    return prompts, chat


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
    assert bare == f"{INSTRUCTIONS} Answer with the action only.\n\nTask: Do it."  # the default turn format


def test_the_chat_template_pieces(builder):
    t = builder.template
    assert (t.system_open, t.system_end) == ("<|im_start|>system\n", "<|im_end|>\n<|im_start|>user\n")
    assert (t.user_end, t.turn_end) == ("<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>user\n")


@pytest.mark.parametrize("eos", [False, True])
def test_the_episode_is_a_chat_whose_user_turns_keep_their_tips(builder, tokenizer, eos):
    """Whether a response stopped at a newline or at the end-of-sequence token (kept in its ids), the
    turn ends with exactly one <|im_end|>."""
    prompts, _ = _play(builder, tokenizer, PAST, STATE, TIPS, eos=eos)
    expected = (
        f"<|im_start|>system\n{system_message(CTX)}<|im_end|>\n"
        f"<|im_start|>user\n{PAST[0][0]}{format_tip_block(PAST[0][1])}<|im_end|>\n"
        f"<|im_start|>assistant\n{PAST[0][2]}<|im_end|>\n"
        f"<|im_start|>user\n{PAST[1][0]}<|im_end|>\n"
        f"<|im_start|>assistant\n{PAST[1][2]}<|im_end|>\n"
        f"<|im_start|>user\n{PAST[2][0]}{format_tip_block(PAST[2][1])}<|im_end|>\n"
        f"<|im_start|>assistant\n{PAST[2][2]}<|im_end|>\n"
        f"<|im_start|>user\n{STATE}{format_tip_block(TIPS)}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    p = prompts[-1]
    assert p.text == expected and p.turns_dropped == 0
    assert p.token_ids.dtype == np.int32 and p.token_ids.ndim == 1
    # one span per tip block shown, in order, each decoding to exactly its block
    blocks = [format_tip_block(PAST[0][1]), format_tip_block(PAST[2][1]), format_tip_block(TIPS)]
    assert len(p.tip_spans) == 3
    for (s, e), block in zip(p.tip_spans, blocks):
        assert tokenizer.decode(p.token_ids[s:e].tolist()) == block
        assert p.token_ids[s:e].tolist() == _encode(tokenizer, block)


def test_each_prompt_extends_the_last_prompt_and_response_token_for_token(builder, tokenizer):
    prompts, chat = _play(builder, tokenizer, PAST, STATE, TIPS)
    assert [p.chain_start for p in prompts] == [True, False, False, False]
    for before, after, turn in zip(prompts, prompts[1:], chat.past):
        head = np.concatenate([before.token_ids, turn.response_ids])
        np.testing.assert_array_equal(after.token_ids[: len(head)], head)
        # the earlier tip spans stay where they were; a new one comes after the response
        assert after.tip_spans[: len(before.tip_spans)] == before.tip_spans
        assert all(s >= len(head) for s, _ in after.tip_spans[len(before.tip_spans) :])


def test_the_generated_tokens_stay_as_generated(builder, tokenizer):
    """Token ids a re-tokenisation of the text would not give (' look' written as ' lo' + 'ok') are
    what the next prompt holds."""
    odd = np.asarray(_encode(tokenizer, " lo") + _encode(tokenizer, "ok around"), np.int32)
    assert odd.tolist() != _encode(tokenizer, " look around")
    chat = builder.chat(CTX)
    first = chat.prompt(PAST[0][0], [])
    chat.answered(PAST[0][0], [], "", odd)
    second = chat.prompt(STATE, [])
    assert not second.chain_start
    assert second.token_ids[len(first.token_ids) : len(first.token_ids) + len(odd)].tolist() == odd.tolist()


def test_the_next_user_turn_names_the_executed_action(builder, tokenizer):
    chat = builder.chat(CTX)
    chat.prompt(PAST[0][0], [])
    chat.answered(PAST[0][0], [], "", np.asarray(_encode(tokenizer, "open the door please"), np.int32))
    p = chat.prompt(STATE, [], executed_note("open door to kitchen"))
    assert p.text.endswith(
        "<|im_start|>user\n(Not a valid action; executed instead: open door to kitchen)\n"
        f"{STATE}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "open the door please<|im_end|>" in p.text  # what the model wrote stays in its chat


def test_removing_every_span_gives_exactly_the_tip_free_prompt(builder, tokenizer):
    """What the off-policy update scores: learner.samples.remove_spans with the turn's spans."""
    with_tips = _play(builder, tokenizer, PAST, STATE, TIPS)[0][-1]
    without = _play(builder, tokenizer, [(s, [], a) for s, _, a in PAST], STATE, [])[0][-1]
    stripped = remove_spans(with_tips.token_ids, with_tips.tip_spans)
    np.testing.assert_array_equal(stripped, without.token_ids)
    rest = tokenizer.decode(stripped.tolist())
    assert "<tip>" not in rest and TIP_HEADER not in rest and all(t not in rest for t in TIPS + PAST[0][1])


def test_history_window_keeps_the_last_n_turns_and_says_so(tokenizer):
    windowed = PromptBuilder(tokenizer, history_window=1, token_budget=100_000)
    prompts, _ = _play(windowed, tokenizer, PAST, STATE, [])
    p = prompts[-1]
    assert p.turns_dropped == 2 and p.chain_start
    assert [q.chain_start for q in prompts] == [True, False, True, True]  # past the window, every turn
    chat_part = p.text.split("<|im_end|>", 1)[1]  # after the system part (whose demonstration names actions)
    assert PAST[0][0] not in chat_part and PAST[1][2] not in chat_part and PAST[2][2] in chat_part
    assert f"<|im_start|>user\n(2 earlier steps are not shown.)\n{PAST[2][0]}" in p.text


def test_past_the_budget_half_the_history_goes_at_once_and_a_new_chain_starts(builder, tokenizer):
    long_past = [(f"Room {i}: you see a table, a chair and a door.", [], f"go to room {i + 1}") for i in range(12)]
    whole, _ = _play(builder, tokenizer, long_past, STATE, [])
    sizes = [len(p.token_ids) for p in whole]
    budget = sizes[8]  # the prompt of turn 9 is the first over it
    trimmed, _ = _play(PromptBuilder(tokenizer, 0, budget), tokenizer, long_past, STATE, [])
    assert [p.chain_start for p in trimmed[:9]] == [True] + [False] * 8
    assert trimmed[9].chain_start and trimmed[9].turns_dropped == 5  # half of the 9 past turns, rounded up
    assert "(5 earlier steps are not shown.)" in trimmed[9].text
    assert all(len(p.token_ids) <= budget for p in trimmed)
    # after the trim the chain goes on until the budget is reached again
    assert [p.chain_start for p in trimmed[10:]] == [False] * len(trimmed[10:])
    assert system_message(CTX) in trimmed[-1].text and trimmed[-1].text.endswith(
        f"{STATE}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_demonstration_that_leaves_no_room_goes_and_the_turns_are_fitted_without_it(builder, tokenizer):
    """A long gold sequence (a task's demonstration was 2450 tokens against a 2048-token context):
    past the budget even without past turns, the demonstration is left out and the turns fitted again
    without it."""
    no_demo = TaskContext(CTX.task, None, CTX.action_templates)
    long_demo = TaskContext(CTX.task, Demonstration(3, CTX.task, ["look around"] * 400), CTX.action_templates)
    budget = len(_play(builder, tokenizer, PAST, STATE, TIPS, ctx=no_demo)[0][-1].token_ids)  # fits without it
    prompts, _ = _play(PromptBuilder(tokenizer, 0, budget), tokenizer, PAST, STATE, TIPS, ctx=long_demo)
    p = prompts[-1]
    assert p.demonstration_dropped and p.turns_dropped == 0 and len(p.token_ids) <= budget
    assert p.text == _play(builder, tokenizer, PAST, STATE, TIPS, ctx=no_demo)[0][-1].text
    tiny = PromptBuilder(tokenizer, history_window=0, token_budget=1).build(CTX, [], STATE, TIPS)
    assert tiny.demonstration_dropped and STATE in tiny.text  # nothing fits: the system and the current turn go


def test_tips_that_leave_no_room_go_from_the_lowest_ranked_and_the_prompt_says_which_it_shows(builder, tokenizer):
    """Ten long reflections outgrew a 2048-token context on their own (the CPU learning profile: a
    2054-token prompt refused by the server, its env actor restarted): past the budget with no past turn
    and no demonstration, the last tips go until the turn fits, and the prompt's tips are those shown."""
    no_demo = TaskContext(CTX.task, None, CTX.action_templates)
    tips = [f"Tip {i}: " + "the animal with the longest life is outside, past the open door. " * 8 for i in range(10)]
    two = PromptBuilder(tokenizer, 0, 100_000).build(no_demo, [], STATE, tips[:2])
    p = PromptBuilder(tokenizer, 0, len(two.token_ids)).build(CTX, [], STATE, tips)
    assert p.tips == tips[:2] and p.demonstration_dropped and len(p.token_ids) <= len(two.token_ids)
    assert p.text == two.text and len(p.tip_spans) == 1
    roomy = builder.build(CTX, [], STATE, tips)
    assert roomy.tips == tips and not roomy.demonstration_dropped  # within the budget every tip stays
    bare = PromptBuilder(tokenizer, 0, 1).build(CTX, [], STATE, tips)
    assert bare.tips == [] and bare.tip_spans == [] and STATE in bare.text  # nothing fits: the bare turn goes


def test_observation_truncated_to_max_chars(tokenizer):
    long_state = "Q" * 50 + "Z" * 50
    p = PromptBuilder(tokenizer, 0, 100_000, max_observation_chars=50).build(TaskContext("t"), [], long_state, [])
    assert "<|im_start|>user\n" + "Q" * 50 + "<|im_end|>" in p.text and "Z" not in p.text


def test_an_extended_prompt_is_the_prompt_rendered_from_scratch(builder, tokenizer):
    """The chat extends its chain by the new user turn alone; rendering the same past anew gives the
    same ids and tip spans."""
    prompts, chat = _play(builder, tokenizer, PAST, STATE, TIPS, eos=True)
    for k, p in enumerate(prompts):
        state, tips = (PAST[k][0], PAST[k][1]) if k < len(PAST) else (STATE, TIPS)
        again = builder.build(CTX, chat.past[:k], state, tips)
        np.testing.assert_array_equal(p.token_ids, again.token_ids)
        assert p.tip_spans == again.tip_spans and p.text == again.text


def test_a_guided_episode_shows_its_guidance_in_the_system_part_as_a_span_of_every_turn(builder, tokenizer):
    """HeRL: the guidance block ends the system part; every turn's prompt records its span with the tip
    spans, so the chain still extends token for token and removing the spans removes it exactly."""
    import dataclasses

    from actors.env_actor.prompts import format_guidance_block
    from learner.samples import remove_spans

    guided = dataclasses.replace(CTX, guidance="It missed: focus on a living thing")
    prompts, _ = _play(builder, tokenizer, PAST, STATE, TIPS, ctx=guided)
    block = format_guidance_block(guided.task, guided.guidance)
    for prompt in prompts:
        start, end = prompt.tip_spans[0]  # the guidance, before any tip block
        assert tokenizer.decode(prompt.token_ids[start:end].tolist()) == block
    plain, _ = _play(builder, tokenizer, PAST, STATE, TIPS)
    for with_guidance, without in zip(prompts, plain):
        (start, end), *tips = with_guidance.tip_spans
        assert tips == [(s + end - start, e + end - start) for s, e in without.tip_spans]  # tips after it, shifted
        np.testing.assert_array_equal(remove_spans(with_guidance.token_ids, [(start, end)]), without.token_ids)
    assert not any(p.chain_start for p in prompts[1:])  # the chain holds


def test_sges_reflection_is_a_span_of_every_turn_and_removing_the_spans_gives_the_prompt_without_it(builder, tokenizer):
    """SGE: the strategy format in the instructions; the group's reflection ends the system part (after
    a guidance block, if any) as an in-context span, so the off-policy update removes it with the tips
    exactly (learner/samples.py: the tip-free prompt drops every span)."""
    import dataclasses

    from actors.env_actor.prompts import system_message
    from actors.env_actor.strategy import STRATEGY_INSTRUCTIONS, format_reflection_block
    from learner.samples import remove_spans

    block = format_reflection_block(["look for an animal outside"], [8.0])
    sge = dataclasses.replace(
        CTX, format_instructions=f"{CTX.format_instructions} {STRATEGY_INSTRUCTIONS}", reflection_block=block
    )
    assert STRATEGY_INSTRUCTIONS in system_message(sge) and STRATEGY_INSTRUCTIONS not in system_message(CTX)
    prompts, _ = _play(builder, tokenizer, PAST, STATE, TIPS, ctx=sge)
    plain, _ = _play(builder, tokenizer, PAST, STATE, TIPS, ctx=dataclasses.replace(sge, reflection_block=""))
    for with_reflection, without in zip(prompts, plain):
        start, end = with_reflection.tip_spans[0]
        assert tokenizer.decode(with_reflection.token_ids[start:end].tolist()) == block
        np.testing.assert_array_equal(
            remove_spans(with_reflection.token_ids, with_reflection.tip_spans),
            remove_spans(without.token_ids, without.tip_spans),
        )
    assert not any(p.chain_start for p in prompts[1:])
