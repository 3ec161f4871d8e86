"""Prompt construction for actions: the reference's prompt (adapted from RLVMR) as a chat, built
token-in/token-out.

  system     instructions, the task, one expert demonstration of the same task (the gold actions
             of another *training* variation), the action templates of the env
  user       the state at turn 0 (+ the tip block shown at that turn)
  assistant  the response of turn 0, its tokens exactly as the policy server generated them
  ...        one user/assistant pair per past turn; each user turn keeps the tips it was shown, and
             says which action was executed when the env mapped the response to another one
  user       the current state (+ its tip block), then the generation prompt

An episode is one chain (Chat): turn t+1's prompt is turn t's prompt, its response tokens, the chat
template's end of that turn (its first token left out when the response already ends with it, as
a response that stopped at the end-of-sequence token does) and the new user turn. Nothing of the
past is encoded again until a trim renders the shown turns anew (the responses never: their ids
are kept), so the learner scores each chain once (learner.packing) and what the model wrote stays
what it reads. Past the token budget half of the past turns shown go
at once (the first user turn left says how many are not shown) and a new chain starts; it starts
again only when the budget is reached again. The system part always stays, except for the
demonstration when even the prompt without any past turn is over the budget (a task whose gold
sequence is long: measured 2450 tokens against a 2048-token context). history_window N > 0 shows
the last N turns only, so past N turns every turn starts a chain.

Each piece is tokenised on its own, so the exact token positions of every tip block are known: the
trajectory records them (tip_spans, possibly several per turn's prompt) and the learner deletes
them for the off-policy update; deleting them all gives exactly the prompt built without tips.
Because the policy server receives these very token ids, the behaviour log-probs refer to exactly
this tokenisation, with or without the tips.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from actors.env_actor.turn_format import ACTION_ONLY

# then the turn format's word on the response (TaskContext.format_instructions: the action only, by default)
INSTRUCTIONS = (
    "You are an agent in ScienceWorld, a text-based science laboratory. Complete the task by issuing "
    "one action per turn."
)
TIP_HEADER = "Here are some memories you collected in your previous exploration:"


def format_tip_block(tips: list[str]) -> str:
    lines = "\n".join(f"{i + 1}. {tip}" for i, tip in enumerate(tips))
    return f"\n<tip>{TIP_HEADER}\n{lines}\n</tip>"


GUIDANCE_HEADER = "Guidance from an earlier attempt at this task:"


def format_guidance_block(task_description: str, guidance: str) -> str:
    """HeRL's guidance block (Assignment.guidance: what the revised attempt achieved and missed) with
    the task description, for a guided episode's prompt; recorded as an in-context span like tips."""
    return f"\n<guidance>{GUIDANCE_HEADER}\nTask: {task_description}\n{guidance}\n</guidance>"


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
    # HeRL's guided episode (Assignment.guidance): a block at the end of the system part, recorded as an
    # in-context span of every turn like a tip block (removed at update time under herl.train_context=stripped)
    guidance: str = ""
    # the response format's instructions (actors/env_actor/turn_format.py; SGE's strategies add theirs)
    format_instructions: str = ACTION_ONLY
    # SGE (actors/env_actor/strategy.py): the group's reflection block (earlier strategies with their
    # scores), an in-context span like the guidance's
    reflection_block: str = ""


@dataclass
class ChatTurn:
    """A past turn as the chain holds it: its user turn (the state, the tips shown with it, the note
    on the action executed the turn before) and the response tokens exactly as generated."""

    state: str
    tips: list[str]
    response_ids: np.ndarray  # int32 [T]
    note: str = ""


@dataclass
class BuiltPrompt:
    token_ids: np.ndarray  # int32 [P]
    tip_spans: list[tuple[int, int]]  # [start, end) token positions of every tip block in the prompt
    text: str  # what the model reads: the tokens decoded
    turns_dropped: int = 0  # oldest past turns left out to fit the token budget (or history_window)
    demonstration_dropped: bool = False  # left out because even without past turns it did not fit
    chain_start: bool = True  # does not extend the previous prompt and response (Trajectory.chain_starts)
    tips: list[str] = field(default_factory=list)  # the tips it shows: those asked for, less any cut to fit


def system_message(ctx: TaskContext) -> str:
    parts = [f"{INSTRUCTIONS} {ctx.format_instructions}", f"Task: {ctx.task}"]
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


def executed_note(action: str) -> str:
    """The next user turn's opening when the env executed `action` instead of what the model wrote."""
    return f"(Not a valid action; executed instead: {action})\n"


class ChatTemplate:
    """The model's chat template as the fixed strings around the contents, found by rendering one
    with markers: [system open] system [system end, user open] user [user end, assistant open]
    response [assistant end, user open] ... The prompt is built from these pieces."""

    def __init__(self, tokenizer):
        marks = {"system": "\x00S\x00", "user": "\x00U\x00", "assistant": "\x00A\x00"}
        text = tokenizer.apply_chat_template(
            [{"role": r, "content": marks[r]} for r in ("system", "user", "assistant", "user")],
            tokenize=False,
            add_generation_prompt=True,
        )
        self.system_open, rest = text.split(marks["system"])
        self.system_end, rest = rest.split(marks["user"], 1)
        self.user_end, rest = rest.split(marks["assistant"])
        self.turn_end, generation = rest.split(marks["user"])
        if generation != self.user_end or not self.turn_end:
            raise ValueError(
                "the chat template does not close a user turn the same way before a response and before "
                f"the generation prompt ({self.user_end!r} vs {generation!r}): a token-in/token-out chat "
                "needs it to"
            )


class PromptBuilder:
    """token_budget: the prompt's token limit (env_actor.prompt_token_budget, resolved against the
    policy server's context); history_window: 0 = every past turn, N = the last N only."""

    def __init__(self, tokenizer, history_window: int, token_budget: int, max_observation_chars: int = 1200):
        self.tokenizer = tokenizer
        self.history_window = history_window
        self.token_budget = token_budget
        self.max_observation_chars = max_observation_chars
        self.template = ChatTemplate(tokenizer)
        self._turn_end = np.asarray(self._encode(self.template.turn_end), np.int32)
        self._user_end = self._encode(self.template.user_end)

    def chat(self, ctx: TaskContext) -> Chat:
        """The prompts of one episode of `ctx`."""
        return Chat(self, ctx)

    def build(self, ctx: TaskContext, past: list[ChatTurn], state: str, tips: list[str], note: str = "") -> BuiltPrompt:
        """The prompt after `past` (a chat that went through those turns), for one-off prompts."""
        chat = Chat(self, ctx)
        chat.past = list(past)
        return chat.prompt(state, tips, note)

    def past_turn(self, state: str, tips: list[str], response_text: str, note: str = "") -> ChatTurn:
        """A past turn whose response is given as text (a recorded episode's action), tokenised."""
        return ChatTurn(state, tips, np.asarray(self._encode(response_text), np.int32), note)

    def turn_end(self, response_ids: np.ndarray) -> np.ndarray:
        """What follows a response in the chain: the template's end of the assistant turn and the next
        user turn's opening, less its first token when the response already ends with it (a response
        that stopped at the end-of-sequence token holds it, as vLLM returns it)."""
        if len(response_ids) and response_ids[-1] == self._turn_end[0]:
            return self._turn_end[1:]
        return self._turn_end

    def render(
        self, ctx: TaskContext, shown: list[ChatTurn], dropped: int, state: str, tips: list[str], note: str
    ) -> BuiltPrompt:
        """The prompt: the system part, the `shown` past turns (`dropped` earlier ones not shown), the
        current user turn and the generation prompt, piece by piece."""
        t = self.template
        ids = self._encode(t.system_open + system_message(ctx))
        spans: list[tuple[int, int]] = []
        for block_text in (format_guidance_block(ctx.task, ctx.guidance) if ctx.guidance else "", ctx.reflection_block):
            if block_text:  # in-context help at the end of the system part: a span of every turn's prompt
                block = self._encode(block_text)
                spans.append((len(ids), len(ids) + len(block)))
                ids += block
        ids += self._encode(t.system_end)
        users = [(turn.note + self._state(turn.state), turn.tips) for turn in shown] + [
            (note + self._state(state), tips)
        ]
        if dropped:
            users[0] = (f"({dropped} earlier steps are not shown.)\n{users[0][0]}", users[0][1])
        for k, (content, turn_tips) in enumerate(users):
            piece, span = self.user_turn(content, turn_tips)
            if span is not None:
                spans.append((len(ids) + span[0], len(ids) + span[1]))
            ids += piece
            if k < len(shown):
                response = shown[k].response_ids
                ids += response.tolist() + self.turn_end(response).tolist()
        token_ids = np.asarray(ids, dtype=np.int32)
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return BuiltPrompt(token_ids, spans, text, dropped, demonstration_dropped=False)

    def user_turn(self, content: str, tips: list[str]) -> tuple[list[int], tuple[int, int] | None]:
        """A user turn's ids (its content, its tip block, the template's end of the turn and opening
        of the response) and the tip block's span in them, if any."""
        ids = self._encode(content)
        span = None
        if tips:
            tip_ids = self._encode(format_tip_block(tips))
            span = (len(ids), len(ids) + len(tip_ids))
            ids += tip_ids
        return ids + self._user_end, span

    def _state(self, state: str) -> str:
        return state.strip()[: self.max_observation_chars]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


class Chat:
    """One episode's prompts, each extending the one before token for token (the chain) until the
    budget or the history window makes it start over with fewer past turns: prompt() for the
    current turn, then answered() with its response."""

    def __init__(self, builder: PromptBuilder, ctx: TaskContext):
        self.builder, self.ctx = builder, ctx
        self.past: list[ChatTurn] = []
        self.first_shown = 0  # past turns before this one are left out
        self.demonstration = ctx.demonstration is not None
        self._extended: np.ndarray | None = None  # the last prompt, its response and the turn's end
        self._pending = np.zeros(0, np.int32)  # the prompt awaiting its response
        self._spans: list[tuple[int, int]] = []  # its tip spans

    def prompt(self, state: str, tips: list[str], note: str = "") -> BuiltPrompt:
        """The current turn's prompt: the chain so far and this user turn. Past the budget, half of
        the past turns shown go at once (again while it does not fit); past it without any, the
        demonstration goes and the turns are fitted again; past it still, the current turn's tips go
        from the last (retrieval ranks them best first; ten reflections can outgrow the context alone);
        if even the bare turn does not fit, the prompt goes as it is (the server refuses it). The tips
        shown are the prompt's `tips`: what answered() is to be given."""
        b = self.builder
        within_window = b.history_window <= 0 or len(self.past) - self.first_shown <= b.history_window
        if self._extended is not None and within_window:  # the chain so far and this user turn, if it fits
            piece, span = b.user_turn(note + b._state(state), tips)
            if len(self._extended) + len(piece) <= b.token_budget:
                at = len(self._extended)
                spans = self._spans + ([(at + span[0], at + span[1])] if span is not None else [])
                token_ids = np.concatenate([self._extended, np.asarray(piece, np.int32)])
                prompt = BuiltPrompt(
                    token_ids, spans, b.tokenizer.decode(token_ids.tolist(), skip_special_tokens=False),
                    self.first_shown, self.ctx.demonstration is not None and not self.demonstration, chain_start=False,
                )  # fmt: skip
                self._pending, self._spans = prompt.token_ids, prompt.tip_spans
                prompt.tips = list(tips)
                return prompt
        if b.history_window > 0:
            self.first_shown = max(self.first_shown, len(self.past) - b.history_window)
        prompt = self._render(state, tips, note)
        while len(prompt.token_ids) > b.token_budget and (
            self.first_shown < len(self.past) or self.demonstration or tips
        ):
            if self.first_shown < len(self.past):
                self.first_shown += max(1, (len(self.past) - self.first_shown + 1) // 2)
            elif self.demonstration:  # no past turn left: without the demonstration, fit the turns again from the start
                self.demonstration = False
                self.first_shown = max(0, len(self.past) - b.history_window) if b.history_window > 0 else 0
            else:  # the current turn alone is over the budget: its lowest-ranked tip goes
                tips = tips[:-1]
            prompt = self._render(state, tips, note)
        prompt.tips = list(tips)
        head = self._extended
        prompt.chain_start = head is None or not (
            len(prompt.token_ids) >= len(head) and np.array_equal(prompt.token_ids[: len(head)], head)
        )
        self._pending, self._spans = prompt.token_ids, prompt.tip_spans
        return prompt

    def answered(self, state: str, tips: list[str], note: str, response_ids: np.ndarray) -> None:
        """The turn just prompted (its state, tips and note, as passed to prompt()) got this response."""
        response_ids = np.asarray(response_ids, dtype=np.int32)
        self.past.append(ChatTurn(state, tips, response_ids, note))
        self._extended = np.concatenate([self._pending, response_ids, self.builder.turn_end(response_ids)])

    def _render(self, state: str, tips: list[str], note: str) -> BuiltPrompt:
        ctx = self.ctx if self.demonstration else dataclasses.replace(self.ctx, demonstration=None)
        prompt = self.builder.render(ctx, self.past[self.first_shown :], self.first_shown, state, tips, note)
        prompt.demonstration_dropped = self.ctx.demonstration is not None and not self.demonstration
        return prompt
