"""The episode logic: one ScienceWorld episode played turn by turn with a policy and a memory given as
callables, so it runs without sockets in tests (EpisodeRunner); its trajectory is what the replay
buffer stores."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from actors.env_actor.config import EnvActorConfig
from actors.env_actor.prompts import Demonstration, PromptBuilder, TaskContext, executed_note
from actors.env_actor.strategy import STRATEGY_INSTRUCTIONS, StrategicResponse, Strategist
from actors.env_actor.turn_format import ACTION, TurnFormat
from common.config import EnvConfig, RunFacts, SgeConfig
from common.model_prep import resolve_model
from common.scienceworld import ScienceWorld, most_similar_action
from protocol.messages import (
    MAX_GENERATED_TEXT_CHARS,
    MAX_GOAL_PROGRESS_CHARS,
    MAX_INVENTORY_CHARS,
    MAX_LOCATION_CHARS,
    TIP_MODES,
    Assignment,
    GenerateResponse,
    Trajectory,
    TurnRecord,
    is_success,
)

# The generation seed of turn t is assignment.seed * TURN_SEEDS + t: one seed per turn, distinct
# across the episodes of a group as long as an episode has fewer turns than this (max_steps).
TURN_SEEDS = 1000

# (prompt token ids, seed) -> response;   (task, variation, state, inventory) -> (tips, n) or None if unreachable
GenerateFn = Callable[[np.ndarray, int], GenerateResponse]
RetrieveFn = Callable[[str, int, str, str], "tuple[list[str], int] | None"]


@dataclass
class Turn:
    prompt_ids: np.ndarray
    tip_spans: list[tuple[int, int]]
    response: GenerateResponse
    num_memories: int
    memory_retrieved: bool  # the retrieval answered (False: it failed, or the mode shows no tips)
    state: str
    action: str
    chain_start: bool  # the prompt does not extend the previous turn's prompt and response
    location: str = ""  # after the action: the room the agent is in
    inventory: str = ""  # after the action: the env's inventory text
    strategic: StrategicResponse | None = None  # SGE: the response's parts, when the turn wrote a strategy


@dataclass
class EpisodeStats:
    invalid_actions: int = 0
    memory_fallbacks: int = 0
    tips_shown: int = 0
    tip_turns: int = 0  # turns whose retrieval gave at least one tip
    step_seconds: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)  # each turn's prompt length
    strategy_tokens: list[int] = field(default_factory=list)  # SGE: each strategy's sampled tokens
    feedbacks: list[str] = field(default_factory=list)  # each action's feedback from the env (SPA's next state)
    notes: list[str] = field(default_factory=list)  # each turn's user-message word on the action mapped before
    phase_seconds: dict[str, float] = field(default_factory=dict)  # ROLLOUT_PHASES of the turns, summed

    def timed(self, phase: str, t0: float) -> float:
        """Add the time since t0 to `phase`; returns now (the next phase's t0)."""
        now = time.perf_counter()
        self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + now - t0
        return now


@dataclass
class Episode:
    """A played episode (EnvWorker.play): the trajectory for the replay buffer, the env's task
    description (the memory service's reflection prompt quotes it) and the turns' statistics."""

    trajectory: Trajectory
    task_description: str
    stats: EpisodeStats


class EpisodeRunner:
    """One episode at a time on one env. demo_steps: None = no demonstration in the prompt; 0 = the
    whole gold path of the demonstration variation; N = its first N actions (env_actor.demonstration,
    env_actor.demo_max_steps). turn_format: how a response is asked for and read (the caller's
    generate asks with its cap and stop strings; actors/env_actor/turn_format.py)."""

    def __init__(
        self,
        env: ScienceWorld,
        prompts: PromptBuilder,
        max_steps: int,
        max_steps_per_task: dict[str, int] | None = None,
        demo_steps: int | None = None,
        sge: SgeConfig | None = None,
        turn_format: TurnFormat = ACTION,
    ):
        self.env, self.prompts = env, prompts
        self.max_steps, self.max_steps_per_task = max_steps, dict(max_steps_per_task or {})
        self.demo_steps = demo_steps
        self.sge = sge if sge is not None and sge.enabled else None
        self.strategist = Strategist(prompts.tokenizer) if self.sge else None
        self.turn_format = turn_format  # how a response is asked for and read (SPA's world-model turns)
        self._task_parts: dict[str, tuple[list[int], dict[int, Demonstration], list[str]]] = {}

    def step_limit(self, task: str) -> int:
        return self.max_steps_per_task.get(task, self.max_steps)

    def demo_variation(self, task: str, variation: int) -> int | None:
        """The training variation whose gold path demonstrates `task` to an episode of `variation`:
        the first training variation other than the one played (never a test variation: for a test
        variation, the first training one)."""
        train = self._parts(task)[0]
        return next((v for v in train if v != variation), None)

    def prompt_parts(self, task: str, variation: int) -> tuple[Demonstration | None, list[str]]:
        """The demonstration and the action templates of the episode's system message (this may load
        another variation: call it before reset)."""
        _, demos, templates = self._parts(task)
        demo = None
        if self.demo_steps is not None:
            demo_variation = self.demo_variation(task, variation)
            if demo_variation is not None:
                if demo_variation not in demos:
                    description, actions = self.env.demonstration(task, demo_variation)
                    demos[demo_variation] = Demonstration(demo_variation, description, actions)
                demo = demos[demo_variation]
                if self.demo_steps > 0:
                    demo = Demonstration(demo.variation, demo.task_description, demo.actions[: self.demo_steps])
        return demo, templates

    def _parts(self, task: str) -> tuple[list[int], dict[int, Demonstration], list[str]]:
        """Per task, cached: its training variations, the demonstrations built so far, its templates."""
        if task not in self._task_parts:
            train = self.env.train_variations(task)  # loads the task: the templates are its
            self._task_parts[task] = (train, {}, self.env.action_templates())
        return self._task_parts[task]

    def play(
        self,
        a: Assignment,
        actor_id: str,
        generate: GenerateFn,
        retrieve: RetrieveFn,
        sge_generate: tuple[GenerateFn, GenerateFn] | None = None,
        reflection: str = "",
    ) -> tuple[Trajectory, EpisodeStats]:
        """One episode. SGE (sge.enabled): at the turns due the strategy comes from `sge_generate`'s first
        function (the member's strategy temperature, stopping at the closing tag), then the action from
        its second (`generate`'s request, at least one token before its stop); `reflection` is the
        group's reflection block for the system part."""
        stats = EpisodeStats()
        demo, templates = self.prompt_parts(a.task, a.variation)
        result = self.env.reset(a.task, a.variation)
        start_inventory = result.inventory
        strategist = self.strategist if sge_generate is not None else None
        instructions = self.turn_format.instructions + (f" {STRATEGY_INSTRUCTIONS}" if strategist else "")
        ctx = TaskContext(self.env.task_description, demo, templates, a.guidance, instructions, reflection)
        chat = self.prompts.chat(ctx)
        turns: list[Turn] = []
        note = ""  # the user turn's word on the action executed at the turn before, when it was mapped
        for t in range(self.step_limit(a.task)):
            t0 = tick = time.perf_counter()
            tips, n, retrieved = [], 0, False
            if a.mode in TIP_MODES:
                found = retrieve(a.task, a.variation, result.state, result.inventory)
                if found is None:  # memory unreachable: no tips, n = 0, marked not retrieved
                    stats.memory_fallbacks += 1
                else:
                    (tips, n), retrieved = found, True
                tick = stats.timed("memory_retrieval", tick)
            prompt = chat.prompt(result.state, tips, note)
            stats.tips_shown += len(prompt.tips)  # those that fit the prompt (Chat.prompt)
            stats.tip_turns += bool(prompt.tips)
            stats.prompt_tokens.append(len(prompt.token_ids))
            stats.notes.append(note)
            tick = stats.timed("prompt", tick)
            seed, strategic = a.seed * TURN_SEEDS + t, None
            if strategist is not None and self.sge.strategy_due(t):
                strategic = strategist.turn(prompt.token_ids, seed, *sge_generate)
                stats.strategy_tokens.append(strategic.strategy_tokens)
                response, action_text = strategic.response, strategic.action_text
            else:
                response = generate(prompt.token_ids, seed)
                action_text = self.turn_format.action_of(response.text)
            tick = stats.timed("generation", tick)
            chat.answered(result.state, prompt.tips, note, response.token_ids)
            action, mapped = most_similar_action(action_text, result.valid_actions)
            stats.invalid_actions += int(mapped)
            note = executed_note(action) if mapped else ""
            turns.append(
                Turn(
                    prompt.token_ids, prompt.tip_spans, response, n, retrieved, result.state, action, prompt.chain_start,
                    strategic=strategic,
                )
            )  # fmt: skip
            result = self.env.step(action)
            turns[-1].location, turns[-1].inventory = result.location, result.inventory
            stats.feedbacks.append(result.observation)
            stats.timed("env_step", tick)
            stats.step_seconds.append(time.perf_counter() - t0)
            if result.done:
                break
        goal_progress = self.env.goal_progress()  # at the episode's end
        trajectory = self._trajectory(
            a, actor_id, turns, result.score, result.done, stats.phase_seconds, start_inventory, goal_progress
        )
        return trajectory, stats

    @staticmethod
    def _trajectory(
        a: Assignment,
        actor_id: str,
        turns: list[Turn],
        score: float,
        done: bool,
        phase_seconds: dict[str, float],
        start_inventory: str,
        goal_progress: str,
    ) -> Trajectory:
        records = [
            TurnRecord(
                prompt_ids=t.prompt_ids,
                response_ids=t.response.token_ids,
                logprobs=t.response.logprobs,
                observation=t.state,
                action=t.action,
                policy_version=t.response.policy_version,
                tip_spans=t.tip_spans,
                num_memories=t.num_memories,
                memory_retrieved=t.memory_retrieved,
                generated_text=t.response.text[:MAX_GENERATED_TEXT_CHARS],
                chain_start=t.chain_start,
                location=t.location[:MAX_LOCATION_CHARS],
                inventory=t.inventory[:MAX_INVENTORY_CHARS],
                temperature=t.response.temperature,
                temperatures=t.strategic.temperatures if t.strategic else None,
                response_mask=t.strategic.mask if t.strategic else None,
                strategy=t.strategic.strategy if t.strategic else "",
            )
            for t in turns
        ]
        return Trajectory.from_turns(
            records,
            episode_id=uuid.uuid4().hex,
            group_id=a.group_id,
            slot=a.slot,
            actor_id=actor_id,
            task=a.task,
            variation=a.variation,
            mode=a.mode,
            score=score,
            done=done,
            success=is_success(done, score),
            phase_seconds=dict(phase_seconds),
            start_inventory=start_inventory[:MAX_INVENTORY_CHARS],
            goal_progress=goal_progress[:MAX_GOAL_PROGRESS_CHARS],
            # the first strategy's temperature, as sampled (an evaluation's assignment carries none)
            strategy_temperature=next((t.strategic.strategy_temperature for t in turns if t.strategic), 0.0),
        )


def open_episode_runner(
    env_actor: EnvActorConfig,
    env: EnvConfig,
    run: RunFacts,
    sge: SgeConfig | None = None,
    turn_format: TurnFormat = ACTION,
) -> EpisodeRunner:
    """The env actor's episode logic over a fresh ScienceWorld; the caller closes runner.env (a JVM)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(run.model.name, run.model.cache_dir or None))
    world = ScienceWorld(env.simplification, step_limit=env.env_step_limit, max_heap_mb=env.jvm_max_heap_mb)
    budget = env_actor.prompt_budget(run.max_model_len, turn_format.max_tokens)
    if sge is not None and sge.enabled:  # the strategy and the actor's glue come before the action
        budget -= sge.max_strategy_tokens + Strategist(tokenizer).max_glue_tokens()
    prompts = PromptBuilder(tokenizer, env_actor.history_window, budget)
    demo_steps = env_actor.demo_max_steps if env_actor.demonstration else None
    return EpisodeRunner(world, prompts, env.max_steps, env.task_limits(), demo_steps, sge, turn_format)
