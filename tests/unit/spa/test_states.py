"""SPA's data (spa/states.py) with the real tokenizer of the embedded model: the true states of a
turn, their substitution into the model's own turn, and the episode as one sequence whose loss covers
exactly the assistant turns (state tokens included), one row per well-formed turn."""

from __future__ import annotations

import pytest

from actors.env_actor.prompts import PromptBuilder, TaskContext
from actors.env_actor.turn_format import WORLD_MODEL_INSTRUCTIONS, answer_of, tagged
from common.model_prep import resolve_model
from spa.collect import plan
from spa.states import (
    CollectedTurn,
    current_state,
    episode_sequence,
    inventory_items,
    next_state,
    rebuilt,
    states_of,
    substituted,
    well_formed,
)

KITCHEN = "This room is called the kitchen. In it, you see:\n\ta fridge\nYou also see:\n\tA door to the hallway"
HALLWAY = "This room is called the hallway. In it, you see:\n\ta picture"
INVENTORY = "In your inventory, you see:\n\tan orange\n\ta thermometer\n"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model("embedded:SmolLM2-135M-Instruct"))


def response(
    observation: str = "I am somewhere", prediction: str = "I will be elsewhere", answer: str = "go to hallway"
) -> str:
    return (
        f"<think><observation>{observation}</observation> I should move. "
        f"<prediction>{prediction}</prediction></think><answer>{answer}"
    )


def test_states_are_the_room_and_the_inventory_before_and_the_feedback_and_both_after():
    assert inventory_items(INVENTORY) == "an orange, a thermometer" and inventory_items("") == "nothing"
    assert current_state("kitchen", INVENTORY) == "Location: kitchen. Inventory: an orange, a thermometer."
    assert next_state("You move to the hallway.\n" + HALLWAY, "hallway", "") == (
        "You move to the hallway. Location: hallway. Inventory: nothing."
    )
    states = states_of(
        [KITCHEN, "You move to the hallway.\n" + HALLWAY],
        ["hallway", "hallway"],
        ["", INVENTORY],
        "",
        ["You move to the hallway.", "You pick up the orange."],
    )
    assert states == [
        ("Location: kitchen. Inventory: nothing.", "You move to the hallway. Location: hallway. Inventory: nothing."),
        (
            "Location: hallway. Inventory: nothing.",
            "You pick up the orange. Location: hallway. Inventory: an orange, a thermometer.",
        ),
    ]


def test_the_true_states_replace_the_models_and_the_answer_is_closed():
    text = substituted(response(), "Location: kitchen.", "Moved. Location: hallway.")
    assert (
        tagged(text, "observation") == "Location: kitchen."
        and tagged(text, "prediction") == "Moved. Location: hallway."
    )
    assert "I should move." in text and text.endswith("<answer>go to hallway</answer>")
    assert answer_of(response()) == "go to hallway" and answer_of("no tags\nopen door") == "open door"
    assert well_formed(response()) and not well_formed("<answer>open door") and not well_formed(response()[10:])


def turns(n: int, malformed: int | None = None) -> list[CollectedTurn]:
    return [
        CollectedTurn(
            state=f"state {k}\n{KITCHEN}",
            note="",
            response="open door" if k == malformed else response(answer=f"open door {k}"),
            action="open door to hallway",
            current=f"Location: kitchen. Inventory: item {k}.",
            next=f"The door is open. Location: kitchen. Inventory: item {k + 1}.",
        )
        for k in range(n)
    ]


def test_an_episode_is_one_sequence_with_a_row_per_well_formed_turn_and_the_loss_on_the_assistant_only(tokenizer):
    builder = PromptBuilder(tokenizer, 0, 1800)
    ctx = TaskContext("Find a living thing.", None, ["open OBJ"], format_instructions=WORLD_MODEL_INSTRUCTIONS)
    seq = episode_sequence(builder, ctx, turns(3, malformed=1), 2048, rebuild=False)
    assert seq.rows == 2 and len(seq.spans) == 2 and len(seq.predictions) == 2  # turn 1 is not trained
    for (start, length), k in zip(seq.spans, (0, 2)):
        text = tokenizer.decode(seq.tokens[start : start + length].tolist())
        assert text == substituted(turns(3)[k].response, turns(3)[k].current, turns(3)[k].next) + "<|im_end|>"
    for (start, length), k in zip(seq.predictions, (0, 2)):
        assert tokenizer.decode(seq.tokens[start : start + length].tolist()).strip() == (
            f"Location: kitchen. Inventory: item {k + 1}."
        )
    trained = {i for start, length in seq.spans for i in range(start, start + length)}
    rest = tokenizer.decode([t for i, t in enumerate(seq.tokens.tolist()) if i not in trained])
    assert "<think>" in rest  # the malformed turn 1 ("open door") is context; turn 0 and 2's tags are trained
    assert rest.count("<observation>") == 1  # the instructions' only: the trained turns' are in their spans
    assert "Find a living thing." in rest and all(f"state {k}\n" in rest for k in range(3))
    assert WORLD_MODEL_INSTRUCTIONS in rest
    everything = episode_sequence(builder, ctx, turns(3, malformed=1), 2048, rebuild=True)
    assert everything.rows == 3
    start, length = everything.spans[1]  # the malformed turn, rebuilt from the truth and the action executed
    assert tokenizer.decode(everything.tokens[start : start + length].tolist()) == (
        rebuilt(turns(3)[1].current, turns(3)[1].next, "open door to hallway") + "<|im_end|>"
    )
    full = episode_sequence(builder, ctx, turns(3), 2048, rebuild=False)
    limit = sum(full.spans[0]) + 10  # room for the first turn only
    cut = episode_sequence(builder, ctx, turns(3), limit, rebuild=False)
    assert cut.rows == 1 and len(cut.tokens) == sum(full.spans[0])  # the later turns past max_length are cut


def test_collection_plays_only_the_given_training_variations_in_turn():
    assignments = plan(["boil", "melt"], {"boil": [1, 3], "melt": [7]}, 5)
    assert [(a.task, a.variation, a.seed) for a in assignments] == [
        ("boil", 1, 0), ("melt", 7, 1), ("boil", 3, 2), ("melt", 7, 3), ("boil", 1, 4)
    ]  # fmt: skip
