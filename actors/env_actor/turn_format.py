"""How a turn's response is asked for and read: the episode logic's one hook for a response format of its
own. The default (ACTION) is the action alone on one line, the newline its stop (env_actor.stop_at_newline)
and env_actor.max_action_tokens its cap. SPA's world-model turns (WORLD_MODEL, spa/) first estimate the
current state and predict the next, then give the action in <answer> tags, in up to spa.max_turn_tokens.
SGE's strategies are another matter (two requests per turn: actors/env_actor/strategy.py) and combine
with either."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# The default system instruction on the format (actors/env_actor/prompts.py: after the agent's instructions)
ACTION_ONLY = "Answer with the action only."

OBSERVATION, PREDICTION, ANSWER = "observation", "prediction", "answer"
WORLD_MODEL_INSTRUCTIONS = (
    "Each turn, first think inside <think></think>: give your estimate of the current state as "
    "<observation>Location: ... Inventory: ...</observation>, reason about what to do, and predict the state "
    "after your action as <prediction>what you will see. Location: ... Inventory: ...</prediction>. Then give "
    "the action inside <answer></answer>."
)


def tagged(text: str, tag: str) -> str | None:
    """The content of the last <tag>...</tag> in `text` (an unclosed last one runs to the end), or None."""
    start = text.rfind(f"<{tag}>")
    if start < 0:
        return None
    content = text[start + len(tag) + 2 :]
    return content.split(f"</{tag}>", 1)[0].strip()


def answer_of(text: str) -> str:
    """The action of a world-model turn: its <answer>, else its last non-empty line (mapped to a valid
    action like any generation)."""
    answer = tagged(text, ANSWER)
    if answer is not None:
        return answer
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@dataclass(frozen=True)
class TurnFormat:
    instructions: str  # the system part's word on the format
    max_tokens: int | None = None  # the response's cap; None: env_actor.max_action_tokens
    stop: tuple[str, ...] | None = None  # its stop strings; None: the newline per env_actor.stop_at_newline
    action_of: Callable[[str], str] = lambda text: text  # the text the env maps to an action


ACTION = TurnFormat(ACTION_ONLY)


def world_model(max_turn_tokens: int) -> TurnFormat:
    """SPA's turn format: the world-model reasoning, then the action in <answer> (its stop)."""
    return TurnFormat(WORLD_MODEL_INSTRUCTIONS, max_turn_tokens, (f"</{ANSWER}>",), answer_of)
