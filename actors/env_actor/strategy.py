"""SGE's turn (Strategy-Guided Exploration, arXiv 2603.02045; conf/preset/sge.yaml): at the turns due
(sge.replan_every), the policy first writes a strategy, what to do to make progress toward the goal,
then the action conditioned on it. Two requests to the policy server, one response in the chain:

  prompt  <strategy>  strategy tokens (sampled at the member's T_s)  [</strategy>]  [\\n]  action tokens (T_a)
          glue        sampled, mask 1                                glue, mask 0           sampled, mask 1

The opening tag is put in by the actor (a 135M model does not open one reliably); the strategy request
stops at the closing tag, so the tag is sampled when the model closes it itself and put in when it was
cut at sge.max_strategy_tokens; a line break goes before the action unless the strategy's last token
already ended the line (the action request stops at the first line break: a leading one would end it
empty). The tokens the actor put in are part of what the model reads in the next turns (the chain), so
they stay in the response, marked 0 in its mask: never trained, never judged by the low-probability
mask, their behaviour log-prob a placeholder 0 (Trajectory.response_mask). Each sampled token keeps the
temperature it was sampled at (Trajectory.temperatures), so the learner scores the strategy at T_s and
the action at T_a.

The reflection (sge.reflection): the memory service's best and most recent earlier strategies of the
task with the scores their episodes reached, fixed per group (StrategyQuery), shown as a block at the
end of the system part and recorded as an in-context span like a tip block, so EMPO2's off-policy update
removes it with the tips.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from protocol.messages import MAX_STRATEGY_CHARS, GenerateResponse

STRATEGY_OPEN, STRATEGY_CLOSE = "<strategy>", "</strategy>"
# the system part's word on the format when strategies are on (the wording of the paper's prompt as
# summaries quote it: "First, give a strategy of what to do to make progress...")
STRATEGY_INSTRUCTIONS = (  # after the turn format's own (the action only, by default)
    f"At the turns that start with {STRATEGY_OPEN}, first give a strategy: what to do to make progress toward "
    f"the goal, in a sentence or two, closed by {STRATEGY_CLOSE}; then write the action on the next line."
)
REFLECTION_HEADER = "Strategies tried earlier on this task, with the score each episode reached:"

# (prompt token ids, seed) -> response
GenerateFn = Callable[[np.ndarray, int], GenerateResponse]


def format_reflection_block(strategies: list[str], scores: list[float]) -> str:
    lines = "\n".join(f"- (score {score:.0f}) {strategy}" for strategy, score in zip(strategies, scores))
    return f"\n<reflection>{REFLECTION_HEADER}\n{lines}\n</reflection>"


@dataclass
class StrategicResponse:
    """A turn's response in parts: the strategy, the glue, the action (see the module's picture)."""

    response: GenerateResponse  # token ids, log-probs (0 on glue) and text of the whole; the older version
    temperatures: np.ndarray  # float32 [T]: T_s on the strategy, T_a on the action, 1 on glue
    mask: np.ndarray  # uint8 [T]: 1 sampled, 0 put in by the actor
    strategy: str  # the strategy's text, without its tags
    action_text: str  # what the env maps to an action
    strategy_tokens: int  # the strategy's sampled tokens
    strategy_temperature: float  # what the strategy was sampled at (a member's T_s; an evaluation's own)


class Strategist:
    """The glue's token ids, once per tokenizer, and the two-request turn."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

        def ids(text: str) -> np.ndarray:
            return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)

        self.open_ids, self.close_ids, self.newline_ids = ids(STRATEGY_OPEN), ids(STRATEGY_CLOSE), ids("\n")

    def max_glue_tokens(self) -> int:
        """What the actor may put in per turn: the context must leave room for it."""
        return len(self.open_ids) + len(self.close_ids) + len(self.newline_ids)

    def turn(
        self, prompt_ids: np.ndarray, seed: int, generate_strategy: GenerateFn, generate_action: GenerateFn
    ) -> StrategicResponse:
        head = np.concatenate([prompt_ids, self.open_ids])
        s = generate_strategy(head, seed)
        text = self.tokenizer.decode(s.token_ids.tolist(), skip_special_tokens=False)
        closed = STRATEGY_CLOSE in text
        strategy, _, after = text.partition(STRATEGY_CLOSE)
        glue = np.zeros(0, np.int32) if closed else self.close_ids
        if not (closed and "\n" in after):
            glue = np.concatenate([glue, self.newline_ids])
        a = generate_action(np.concatenate([head, s.token_ids, glue]), seed)
        parts = [(self.open_ids, None), (s.token_ids, s), (glue, None), (a.token_ids, a)]
        token_ids = np.concatenate([ids for ids, _ in parts]).astype(np.int32)
        logprobs = np.concatenate([np.zeros(len(ids)) if r is None else r.logprobs for ids, r in parts])
        temperatures = np.concatenate([np.full(len(ids), 1.0 if r is None else r.temperature) for ids, r in parts])
        mask = np.concatenate([np.full(len(ids), 0 if r is None else 1) for ids, r in parts])
        whole = GenerateResponse(
            request_id=a.request_id,
            token_ids=token_ids,
            logprobs=logprobs.astype(np.float32),
            text=self.tokenizer.decode(token_ids.tolist(), skip_special_tokens=False),
            # both parts' behaviour log-probs are recorded per token; the turn counts as the older version
            policy_version=min(s.policy_version, a.policy_version),
            finish_reason=a.finish_reason,
            temperature=a.temperature,
        )
        return StrategicResponse(
            whole,
            temperatures.astype(np.float32),
            mask.astype(np.uint8),
            " ".join(strategy.split())[:MAX_STRATEGY_CHARS],
            a.text,
            len(s.token_ids),
            s.temperature,
        )
