"""Prompt construction for actions: task, recent history, current state, optional <tip> block.

The prompt is tokenised here, in segments, so the exact token positions of every tip block are
known: the trajectory records them (tip_spans) and the learner deletes them for the off-policy
update. Because the policy server receives these very token ids, the behaviour log-probs refer
to exactly this tokenisation, with or without the tips.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SYSTEM_PROMPT = (
    "You are an agent in ScienceWorld, a text-based science laboratory. Complete the task by "
    "issuing one action per turn, for example: look around, look at OBJ, teleport to LOCATION, "
    "open OBJ, pick up OBJ, focus on OBJ, move OBJ to OBJ, activate OBJ, use OBJ on OBJ, wait. "
    "Answer with the action only."
)
TIP_HEADER = "Here are some memories you collected in your previous exploration:"
_TIP_SLOT = "\x00TIP\x00"  # stands where the tip block goes while the chat template is rendered


def format_tip_block(tips: list[str]) -> str:
    lines = "\n".join(f"{i + 1}. {tip}" for i, tip in enumerate(tips))
    return f"\n<tip>{TIP_HEADER}\n{lines}\n</tip>"


@dataclass
class BuiltPrompt:
    token_ids: np.ndarray  # int32 [P]
    tip_spans: list[tuple[int, int]]  # [start, end) token positions of tip blocks
    text: str


# A past step's observation in the prompt's history is cut to this many characters: the current
# state gets max_observation_chars; the history only reminds the policy of what followed its actions.
HISTORY_OBSERVATION_CHARS = 160


class PromptBuilder:
    def __init__(self, tokenizer, history_window: int, max_observation_chars: int = 1200):  # env_actor.history_window
        self.tokenizer = tokenizer
        self.history_window = history_window
        self.max_observation_chars = max_observation_chars

    def user_message(self, task: str, history: list[tuple[str, str]], state: str) -> str:
        parts = [f"Task: {task}"]
        recent = history[-self.history_window :] if self.history_window > 0 else []
        if recent:
            steps = "\n".join(f"> {action}\n{obs.strip()[:HISTORY_OBSERVATION_CHARS]}" for action, obs in recent)
            parts.append(f"Your most recent actions and what followed:\n{steps}")
        parts.append(f"Current state:\n{state.strip()[: self.max_observation_chars]}")
        parts.append("What is your next action?")
        return "\n\n".join(parts)

    def build(self, task: str, history: list[tuple[str, str]], state: str, tips: list[str]) -> BuiltPrompt:
        user = self.user_message(task, history, state) + (_TIP_SLOT if tips else "")
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        segments = text.split(_TIP_SLOT)
        ids: list[int] = []
        spans: list[tuple[int, int]] = []
        tip_text = format_tip_block(tips) if tips else ""
        for i, segment in enumerate(segments):
            if i > 0:
                tip_ids = self._encode(tip_text)
                spans.append((len(ids), len(ids) + len(tip_ids)))
                ids += tip_ids
            ids += self._encode(segment)
        return BuiltPrompt(np.asarray(ids, dtype=np.int32), spans, text.replace(_TIP_SLOT, tip_text))

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
