"""SPA's data: the true states of a collected episode, their substitution into the model's own
world-model turns, and one token sequence per episode for the SFT.

States (SPA's state estimation, on ScienceWorld): the current state of turn t is the room and the
inventory before its action; the next state is the action's feedback (its first line) and the room and
inventory after it. Both stay short, so rows fit the context (the whole `look` text is in the prompt
already): "Location: kitchen. Inventory: an orange, a thermometer."

Rows (the paper's Eq. 1-2): each assistant turn is a row whose prompt is everything before it, the
earlier turns substituted too, and whose loss covers the whole turn, state tokens included (the
released code masks the states out: the paper's own ablation, which "yields no improvement"). The rows
of one episode are one sequence with the loss on every well-formed turn: the same gradient as the rows
one by one (causal attention), at the cost of one forward. A malformed turn (no <observation>,
<prediction> or <answer>) stays in the sequence as the model wrote it, untrained (spa.malformed=drop),
or is rebuilt in the format from the true states and the action executed, and trained (rebuild).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from actors.env_actor.prompts import PromptBuilder, TaskContext
from actors.env_actor.turn_format import ANSWER, OBSERVATION, PREDICTION
from common.scienceworld import room_of

INVENTORY_HEADER = "In your inventory, you see:"
MAX_STATE_CHARS = 300  # a state line at most (a long inventory is cut)


def inventory_items(inventory: str) -> str:
    """ScienceWorld's inventory text as one line of items ("nothing" when empty)."""
    items = [line.strip() for line in inventory.replace(INVENTORY_HEADER, "").splitlines() if line.strip()]
    return ", ".join(items) or "nothing"


def current_state(location: str, inventory: str) -> str:
    return f"Location: {location or 'unknown'}. Inventory: {inventory_items(inventory)}."[:MAX_STATE_CHARS]


def next_state(feedback: str, location: str, inventory: str) -> str:
    first_line = next((line.strip() for line in feedback.splitlines() if line.strip()), "")
    return f"{first_line} {current_state(location, inventory)}"[:MAX_STATE_CHARS]


@dataclass
class CollectedTurn:
    state: str  # the state shown in the turn's user message
    note: str  # the user message's word on the previous action, when the env mapped it
    response: str  # what the model wrote (up to its </answer>, which the stop kept out of the text)
    action: str  # what the env executed
    current: str  # the true state before the action (current_state)
    next: str  # the true state after it (next_state)


def well_formed(response: str) -> bool:
    return all(f"<{tag}>" in response and f"</{tag}>" in response for tag in (OBSERVATION, PREDICTION)) and (
        f"<{ANSWER}>" in response
    )


def rebuilt(current: str, next_: str, action: str) -> str:
    """A malformed turn in the format, from the true states and the action the env executed (spa.malformed=rebuild)."""
    return (
        f"<think><{OBSERVATION}>{current}</{OBSERVATION}> <{PREDICTION}>{next_}</{PREDICTION}></think>"
        f"<{ANSWER}>{action}</{ANSWER}>"
    )


def substituted(response: str, current: str, next_: str) -> str:
    """The turn with its <observation> content replaced by the true current state and its
    <prediction> content by the true next state (the paper's ground-truth substitution), closed by
    </answer> (the stop string the text lacks)."""
    for tag, truth in ((OBSERVATION, current), (PREDICTION, next_)):
        response = re.sub(
            f"<{tag}>.*?</{tag}>", lambda _m, t=tag, v=truth: f"<{t}>{v}</{t}>", response, count=1, flags=re.S
        )
    return response if response.rstrip().endswith(f"</{ANSWER}>") else f"{response}</{ANSWER}>"


@dataclass
class Sequence:
    """One episode for the SFT: its tokens and the spans the loss covers."""

    tokens: np.ndarray  # int32 [L]
    spans: list[tuple[int, int]]  # (start, length) of each trained assistant turn, end of turn included
    predictions: list[tuple[int, int]]  # (start, length) of each trained turn's predicted location and inventory
    rows: int  # trained turns


def episode_sequence(
    builder: PromptBuilder, ctx: TaskContext, turns: list[CollectedTurn], max_length: int, rebuild: bool
) -> Sequence:
    """The episode's chat as one token chain (the env actor's own prompt construction), the turns
    substituted (a malformed one untrained, or with `rebuild` rebuilt and trained); cut before the
    first turn that would pass `max_length` or start a new chain."""
    tokenizer = builder.tokenizer
    eos = int(builder.turn_end(np.zeros(0, np.int32))[0])  # the template's end of an assistant turn
    chat = builder.chat(ctx)
    tokens = np.zeros(0, np.int32)
    spans, predictions = [], []
    for k, turn in enumerate(turns):
        prompt = chat.prompt(turn.state, [], turn.note)
        if k and prompt.chain_start:  # a trimmed history: the sequence ends with the turns before
            break
        trained = well_formed(turn.response) or rebuild
        if well_formed(turn.response):
            text = substituted(turn.response, turn.current, turn.next)
        else:
            text = rebuilt(turn.current, turn.next, turn.action) if rebuild else turn.response
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        response = np.asarray([*encoded["input_ids"], eos], np.int32)
        if len(prompt.token_ids) + len(response) > max_length:
            break
        start = len(prompt.token_ids)
        if trained:
            spans.append((start, len(response)))
            where = prediction_chars(text)
            if where is not None:
                ids = [i for i, (a, b) in enumerate(encoded["offset_mapping"]) if a < where[1] and b > where[0]]
                predictions.append((start + ids[0], len(ids)))
        tokens = np.concatenate([prompt.token_ids, response])
        chat.answered(turn.state, [], turn.note, response)
    return Sequence(tokens, spans, predictions, len(spans))


def prediction_chars(text: str) -> tuple[int, int] | None:
    """The characters of the predicted location and inventory ("Location: ... ." to the end of the
    prediction) in a substituted turn: what the next-state accuracy checks."""
    match = re.search(f"<{PREDICTION}>.*?(Location: .*?)</{PREDICTION}>", text, re.S)
    return match.span(1) if match else None


def states_of(
    observations: list[str], locations: list[str], inventories: list[str], start_inventory: str, feedbacks: list[str]
) -> list[tuple[str, str]]:
    """(current, next) true states of each turn of an episode (Trajectory's fields, the actions'
    feedbacks): before turn t the room and inventory after turn t-1 (at turn 0: the room of the first
    state shown and the inventory at reset)."""
    before_rooms = [room_of(observations[0]), *locations[:-1]]
    before_inventories = [start_inventory, *inventories[:-1]]
    return [
        (current_state(room, inventory), next_state(feedback, location, after))
        for room, inventory, feedback, location, after in zip(
            before_rooms, before_inventories, feedbacks, locations, inventories
        )
    ]
