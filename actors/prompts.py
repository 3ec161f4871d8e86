"""Prompt construction for actions: the reference's prompt (adapted from RLVMR) as a chat.

  system     instructions, the task, one expert demonstration of the same task (the gold actions
             of another *training* variation), the action templates of the env
  user       the state at turn 0 (+ the tip block shown at that turn)
  assistant  the action taken at turn 0
  ...        one user/assistant pair per past turn; each user turn keeps the tips it was shown
  user       the current state (+ its tip block), then the generation prompt

The episode is kept whole up to a token budget: past the budget the oldest turns go first (the
first user turn left says how many are not shown); the current turn always stays, and so does the
system part, except for the demonstration when even the prompt without any past turn is over the
budget (a task whose gold sequence is long: measured 2450 tokens against a 2048-token context).

The prompt is tokenised here, in segments split at the end of every user turn, so the exact token
positions of every tip block are known: the trajectory records them (tip_spans, possibly several
per turn's prompt) and the learner deletes them for the off-policy update; deleting them all gives
exactly the prompt built without tips. Because the policy server receives these very token ids, the
behaviour log-probs refer to exactly this tokenisation, with or without the tips.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

INSTRUCTIONS = (
    "You are an agent in ScienceWorld, a text-based science laboratory. Complete the task by issuing "
    "one action per turn. Answer with the action only."
)
TIP_HEADER = "Here are some memories you collected in your previous exploration:"
_TIP_SLOT = "\x00TIP\x00"  # ends every user turn while the chat template is rendered: the tip block goes there


def format_tip_block(tips: list[str]) -> str:
    lines = "\n".join(f"{i + 1}. {tip}" for i, tip in enumerate(tips))
    return f"\n<tip>{TIP_HEADER}\n{lines}\n</tip>"


@dataclass
class Demonstration:
    """An expert run of the same task: ScienceWorld's gold action sequence of another training
    variation (common/scienceworld.py, ScienceWorld.demonstration)."""

    variation: int
    task_description: str  # that variation's (its target may differ from the episode's)
    actions: list[str]


@dataclass
class TaskContext:
    """The fixed part of an episode's prompts: the system message."""

    task: str  # the env's task description of the variation played
    demonstration: Demonstration | None = None
    action_templates: list[str] = field(default_factory=list)  # ScienceWorld.action_templates()


@dataclass
class ChatTurn:
    """A past turn as its prompt showed it: the state, the tips shown with it, the action taken."""

    state: str
    tips: list[str]
    action: str


@dataclass
class BuiltPrompt:
    token_ids: np.ndarray  # int32 [P]
    tip_spans: list[tuple[int, int]]  # [start, end) token positions of every tip block in the prompt
    text: str
    turns_dropped: int = 0  # oldest past turns left out to fit the token budget (or history_window)
    demonstration_dropped: bool = False  # left out because even without past turns it did not fit


def system_message(ctx: TaskContext) -> str:
    parts = [INSTRUCTIONS, f"Task: {ctx.task}"]
    demo = ctx.demonstration
    if demo is not None and demo.actions:
        steps = "\n".join(f"> {action}" for action in demo.actions)
        parts.append(
            "An expert demonstration of this kind of task (another variation of it), one action per line:\n"
            f"Task: {demo.task_description}\n{steps}"
        )
    if ctx.action_templates:
        parts.append(
            "Action templates (OBJ stands for an object or a place the current state names):\n"
            + "\n".join(ctx.action_templates)
        )
    return "\n\n".join(parts)


class PromptBuilder:
    """token_budget: the prompt's token limit (env_actor.prompt_token_budget, resolved against the
    policy server's context); history_window: 0 = every past turn, N = the last N only."""

    def __init__(self, tokenizer, history_window: int, token_budget: int, max_observation_chars: int = 1200):
        self.tokenizer = tokenizer
        self.history_window = history_window
        self.token_budget = token_budget
        self.max_observation_chars = max_observation_chars

    def build(self, ctx: TaskContext, past: list[ChatTurn], state: str, tips: list[str]) -> BuiltPrompt:
        """The prompt of the current turn: the fewest oldest past turns left out that fit the budget.
        If even no past turn fits, the demonstration goes too and the turns are fitted again without
        it; if that does not fit either, the prompt goes as it is (the server refuses it)."""
        prompt = self._fit(ctx, past, state, tips)
        if len(prompt.token_ids) <= self.token_budget or ctx.demonstration is None:
            return prompt
        prompt = self._fit(dataclasses.replace(ctx, demonstration=None), past, state, tips)
        prompt.demonstration_dropped = True
        return prompt

    def _fit(self, ctx: TaskContext, past: list[ChatTurn], state: str, tips: list[str]) -> BuiltPrompt:
        """The prompt with the fewest oldest past turns left out that fits the budget (all of them
        left out if none fits)."""
        shown = past[-self.history_window :] if self.history_window > 0 else list(past)
        windowed = len(past) - len(shown)
        prompt = self._render(ctx, shown, state, tips, windowed)
        if len(prompt.token_ids) <= self.token_budget or not shown:
            return prompt
        low, high = 0, len(shown)  # the smallest number of turns to drop lies in (low, high]
        best = None  # the rendering that drops `high` turns, once one fits
        while high - low > 1:  # fewer turns, fewer tokens: bisect
            mid = (low + high) // 2
            candidate = self._render(ctx, shown[mid:], state, tips, windowed + mid)
            if len(candidate.token_ids) <= self.token_budget:
                high, best = mid, candidate
            else:
                low = mid
        return best or self._render(ctx, [], state, tips, windowed + len(shown))

    def _render(
        self, ctx: TaskContext, shown: list[ChatTurn], state: str, tips: list[str], dropped: int
    ) -> BuiltPrompt:
        users = [self._state(t.state) for t in shown] + [self._state(state)]
        if dropped:
            users[0] = f"({dropped} earlier steps are not shown.)\n{users[0]}"
        blocks = [format_tip_block(t.tips) if t.tips else "" for t in shown] + [format_tip_block(tips) if tips else ""]
        messages = [{"role": "system", "content": system_message(ctx)}]
        for i, user in enumerate(users):
            messages.append({"role": "user", "content": user + _TIP_SLOT})
            if i < len(shown):
                messages.append({"role": "assistant", "content": shown[i].action})
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        segments = text.split(_TIP_SLOT)
        assert len(segments) == len(blocks) + 1, "a state or tip contains the tip slot marker"
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        for i, segment in enumerate(segments):
            if i > 0 and blocks[i - 1]:
                tip_ids = self._encode(blocks[i - 1])
                spans.append((len(ids), len(ids) + len(tip_ids)))
                ids += tip_ids
            ids += self._encode(segment)
        rendered = "".join(s + (blocks[i] if i < len(blocks) else "") for i, s in enumerate(segments))
        return BuiltPrompt(np.asarray(ids, dtype=np.int32), spans, rendered, dropped)

    def _state(self, state: str) -> str:
        return state.strip()[: self.max_observation_chars]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
