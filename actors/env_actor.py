"""Env actor: plays ScienceWorld episodes with the served policy and streams them to the buffer.

Sockets (all DEALER clients, request/reply):
  replay buffer : AssignmentRequest -> Assignment | Wait ; Trajectory -> Ack (persisted)
  policy servers: GenerateRequest -> GenerateResponse (round-robin over endpoints.policy_servers)
  memory service: MemoryQuery -> MemoryResult ; EpisodeReport -> Ack   (best effort, bounded)

The episode logic (EpisodeRunner) takes its policy and memory as callables, so it runs without
sockets in tests; an EnvWorker owns one env's sockets, retries and metrics, and its public client
API (open, wait_ready, play, report_episode) is what evaluation drivers use too; EnvActor is the
process: envs_per_actor workers in threads.

Run: `empo2-env-actor env_actor.index=0 [key=value ...]`.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import zmq

from actors.prompts import Demonstration, PromptBuilder, TaskContext, executed_note
from common.logs import short_id
from common.metrics import EnvActorMetrics
from common.model_prep import resolve_model
from common.process import run_role
from common.scienceworld import ScienceWorld, most_similar_action
from pipeline.cli import role_config
from pipeline.config import PipelineConfig
from protocol import Client, RemoteError, RequestTimeout
from protocol.messages import (
    MAX_GENERATED_TEXT_CHARS,
    TIP_MODES,
    Ack,
    Assignment,
    AssignmentRequest,
    AssignmentReturn,
    EpisodeReport,
    GenerateRequest,
    GenerateResponse,
    MemoryQuery,
    MemoryResult,
    Trajectory,
    Wait,
    is_success,
)
from protocol.transport import wait_until_ready

log = logging.getLogger("env_actor")

# The generation seed of turn t is assignment.seed * TURN_SEEDS + t: one seed per turn, distinct
# across the episodes of a group as long as an episode has fewer turns than this (max_steps).
TURN_SEEDS = 1000
# The buffer answered an AssignmentRequest with neither an Assignment nor a Wait: ask again after this.
UNEXPECTED_REPLY_RETRY_S = 1.0
# How long a stopping actor waits for the buffer to take back its unfinished slot.
RETURN_TIMEOUT_S = 2.0
# How often the env actor process checks that all its env threads still play.
THREAD_CHECK_S = 0.5

# (prompt token ids, seed) -> response;   (task, variation, state) -> (tips, n) or None if unreachable
GenerateFn = Callable[[np.ndarray, int], GenerateResponse]
RetrieveFn = Callable[[str, int, str], "tuple[list[str], int] | None"]


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


@dataclass
class EpisodeStats:
    invalid_actions: int = 0
    memory_fallbacks: int = 0
    tips_shown: int = 0
    step_seconds: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)  # each turn's prompt length
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
    env_actor.demo_max_steps)."""

    def __init__(
        self,
        env: ScienceWorld,
        prompts: PromptBuilder,
        max_steps: int,
        max_steps_per_task: dict[str, int] | None = None,
        demo_steps: int | None = None,
    ):
        self.env, self.prompts = env, prompts
        self.max_steps, self.max_steps_per_task = max_steps, dict(max_steps_per_task or {})
        self.demo_steps = demo_steps
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
        self, a: Assignment, actor_id: str, generate: GenerateFn, retrieve: RetrieveFn
    ) -> tuple[Trajectory, EpisodeStats]:
        stats = EpisodeStats()
        demo, templates = self.prompt_parts(a.task, a.variation)
        result = self.env.reset(a.task, a.variation)
        chat = self.prompts.chat(TaskContext(self.env.task_description, demo, templates))
        turns: list[Turn] = []
        note = ""  # the user turn's word on the action executed at the turn before, when it was mapped
        for t in range(self.step_limit(a.task)):
            t0 = tick = time.perf_counter()
            tips, n, retrieved = [], 0, False
            if a.mode in TIP_MODES:
                found = retrieve(a.task, a.variation, result.state)
                if found is None:  # memory unreachable: no tips, n = 0, marked not retrieved
                    stats.memory_fallbacks += 1
                else:
                    (tips, n), retrieved = found, True
                    stats.tips_shown += len(tips)
                tick = stats.timed("memory_retrieval", tick)
            prompt = chat.prompt(result.state, tips, note)
            stats.prompt_tokens.append(len(prompt.token_ids))
            tick = stats.timed("prompt", tick)
            response = generate(prompt.token_ids, a.seed * TURN_SEEDS + t)
            tick = stats.timed("generation", tick)
            chat.answered(result.state, tips, note, response.token_ids)
            action, mapped = most_similar_action(response.text, result.valid_actions)
            stats.invalid_actions += int(mapped)
            note = executed_note(action) if mapped else ""
            turns.append(
                Turn(
                    prompt.token_ids, prompt.tip_spans, response, n, retrieved, result.state, action, prompt.chain_start
                )
            )
            result = self.env.step(action)
            stats.timed("env_step", tick)
            stats.step_seconds.append(time.perf_counter() - t0)
            if result.done:
                break
        return self._trajectory(a, actor_id, turns, result.score, result.done, stats.phase_seconds), stats

    @staticmethod
    def _trajectory(
        a: Assignment, actor_id: str, turns: list[Turn], score: float, done: bool, phase_seconds: dict[str, float]
    ) -> Trajectory:
        def offsets(arrays):
            return np.concatenate([[0], np.cumsum([len(x) for x in arrays])]).astype(np.int64)

        prompts = [t.prompt_ids for t in turns]
        responses = [t.response.token_ids for t in turns]
        spans = [(i, s, e) for i, t in enumerate(turns) for s, e in t.tip_spans]
        return Trajectory(
            episode_id=uuid.uuid4().hex,
            group_id=a.group_id,
            slot=a.slot,
            actor_id=actor_id,
            task=a.task,
            variation=a.variation,
            mode=a.mode,
            score=score,
            done=done,
            prompt_token_ids=np.concatenate(prompts).astype(np.int32),
            prompt_offsets=offsets(prompts),
            response_token_ids=np.concatenate(responses).astype(np.int32),
            response_offsets=offsets(responses),
            behaviour_logprobs=np.concatenate([t.response.logprobs for t in turns]).astype(np.float32),
            tip_spans=np.asarray(spans, dtype=np.int32).reshape(-1, 3),
            policy_versions=np.asarray([t.response.policy_version for t in turns], dtype=np.int32),
            num_memories=np.asarray([t.num_memories for t in turns], dtype=np.int32),
            observations=[t.state for t in turns],
            actions=[t.action for t in turns],
            memory_retrieved=np.asarray([t.memory_retrieved for t in turns], dtype=np.uint8),
            generated_texts=[t.response.text[:MAX_GENERATED_TEXT_CHARS] for t in turns],
            success=is_success(done, score),
            phase_seconds=dict(phase_seconds),
            chain_starts=np.asarray([t.chain_start for t in turns], dtype=np.uint8),
        )


def open_episode_runner(cfg: PipelineConfig) -> EpisodeRunner:
    """The env actor's episode logic over a fresh ScienceWorld; the caller closes runner.env (a JVM)."""
    from transformers import AutoTokenizer

    ecfg = cfg.env
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.model.name, cfg.model.cache_dir or None))
    acfg = cfg.env_actor
    env = ScienceWorld(ecfg.simplification, step_limit=ecfg.env_step_limit)
    budget = acfg.prompt_budget(cfg.policy_server.max_model_len)
    prompts = PromptBuilder(tokenizer, acfg.history_window, budget)
    demo_steps = acfg.demo_max_steps if acfg.demonstration else None
    return EpisodeRunner(env, prompts, ecfg.max_steps, ecfg.task_limits(), demo_steps)


class ServerChooser:
    """Which policy server gets the next request: the one with the fewest requests in flight from
    this process (ties and "round_robin" rotate). Shared by the env threads of one process.

    A server whose request timed out (down or hung, e.g. SIGSTOPped) is passed over for
    `retry_after_s` (env_actor.policy_retry_after_s) while another one is up, so the retry and
    the requests that follow fail over at once instead of each waiting out the timeout."""

    def __init__(self, num_servers: int, policy: str, retry_after_s: float):  # env_actor.server_selection (validated)
        self.in_flight = [0] * num_servers
        self.policy = policy
        self.retry_after_s = retry_after_s
        self.down_until = [0.0] * num_servers  # monotonic time until which a timed-out server is passed over
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            start = next(self._turn) % len(self.in_flight)
            order = [(start + k) % len(self.in_flight) for k in range(len(self.in_flight))]
            now = time.monotonic()
            order = [i for i in order if self.down_until[i] <= now] or order  # all down: try them anyway
            index = min(order, key=lambda i: self.in_flight[i]) if self.policy == "least_loaded" else order[0]
            self.in_flight[index] += 1
            return index

    def mark_down(self, index: int) -> None:
        with self._lock:
            self.down_until[index] = time.monotonic() + self.retry_after_s

    def release(self, index: int) -> None:
        with self._lock:
            self.in_flight[index] -= 1


class EnvWorker:
    """One ScienceWorld env's episodes and the sockets they use (ZeroMQ sockets are per thread: an
    env actor process runs env_actor.envs_per_actor workers, one thread each).

    The client API is public, so an evaluation driver plays episodes exactly as the actors do:
      open()                                   load the env (a JVM) and the tokenizer, once
      wait_ready(buffer=, memory=, ...)        handshake with the servers the episodes need
      play(assignment, temperature) -> Episode one episode; nothing is uploaded or reported
      report_episode(episode)                  the episode to the memory service (best effort)
      generate(...), retrieve(...)             the two requests of a turn, as play() makes them
      close()                                  the env and the sockets
    run() is the training loop over the same calls: assignment from the buffer, play, upload,
    report, metrics."""

    def __init__(
        self,
        cfg: PipelineConfig,
        metrics: EnvActorMetrics | None = None,
        slot: int = 0,
        chooser: ServerChooser | None = None,
        runner: EpisodeRunner | None = None,
    ):
        self.cfg, self.acfg = cfg, cfg.env_actor
        self.actor_id = f"actor{self.acfg.index}" + (f".{slot}" if slot else "")
        self.metrics = metrics or EnvActorMetrics()
        ctx = zmq.Context.instance()
        self.buffer = Client(ctx, cfg.endpoints.replay_buffer, self.acfg.buffer_timeout_s)
        self.memory = Client(ctx, cfg.endpoints.memory_service, self.acfg.memory_timeout_s)
        self.policies = [Client(ctx, ep, self.acfg.generate_timeout_s) for ep in cfg.endpoints.policy_servers]
        self.chooser = chooser or ServerChooser(
            len(self.policies), self.acfg.server_selection, self.acfg.policy_retry_after_s
        )
        self.runner = runner  # the episode logic over this worker's env; open() builds it when None
        self._request_ids = itertools.count()
        self._memory_down_until = 0.0  # monotonic time until which retrieval is skipped
        self.playing: Assignment | None = None  # run()'s slot until its trajectory is acknowledged

    # ------------------------------------------------------------------------------ client API
    def open(self) -> EpisodeRunner:
        """The episode logic over this worker's own ScienceWorld, built on first use."""
        if self.runner is None:
            self.runner = open_episode_runner(self.cfg)
        return self.runner

    @property
    def env(self) -> ScienceWorld:
        """This worker's ScienceWorld (its train and test variation lists, its task description)."""
        return self.open().env

    def close(self) -> None:
        if self.runner is not None:
            self.runner.env.close()
            self.runner = None
        for client in [self.buffer, self.memory, *self.policies]:
            client.close()

    def wait_ready(
        self,
        buffer: bool = True,
        memory: bool = False,
        timeout_s: float | None = None,
        on_wait: Callable[[str, float], None] | None = None,
    ) -> None:
        """Ping every policy server (and the replay buffer, the memory service if asked) until it
        answers ready, at most `timeout_s` (startup_timeout_s) each; TimeoutError if one
        does not. `on_wait(endpoint, seconds_left)` runs between attempts, e.g. to check that the
        processes serving them are alive."""
        timeout_s = self.cfg.startup_timeout_s if timeout_s is None else timeout_s
        clients = [*([self.buffer] if buffer else []), *self.policies, *([self.memory] if memory else [])]
        for client in clients:

            def waiting(left: float, endpoint: str = client.endpoint) -> None:
                log.info("waiting for %s (%.0fs left)", endpoint, left)
                if on_wait is not None:
                    on_wait(endpoint, left)

            pong = wait_until_ready(client, self.actor_id, timeout_s, on_wait=waiting)
            self.metrics.policy_version.set(max(pong.policy_version, 0))

    def play(self, assignment: Assignment, temperature: float | None = None) -> Episode:
        """One episode of `assignment` (task, variation, mode, seed) with the served policy,
        sampling at `temperature` (default env_actor.temperature); in the tip modes every turn
        asks the memory service for tips. Nothing is uploaded or reported: run() does both."""
        runner = self.open()
        trajectory, stats = runner.play(
            assignment,
            self.actor_id,
            lambda prompt_ids, seed: self.generate(prompt_ids, seed, temperature),
            self.retrieve,
        )
        return Episode(trajectory, runner.env.task_description, stats)

    def generate(self, prompt_ids: np.ndarray, seed: int, temperature: float | None = None) -> GenerateResponse:
        """The next action's text from a policy server: the chooser picks the server; after a
        timeout that server is passed over for env_actor.policy_retry_after_s and the retry goes
        to another one. `temperature` defaults to env_actor.temperature."""
        request = GenerateRequest(
            request_id=f"{self.actor_id}-{next(self._request_ids)}",
            prompt_token_ids=prompt_ids,
            max_tokens=self.acfg.max_action_tokens,
            temperature=self.acfg.temperature if temperature is None else temperature,
            seed=seed,
            stop=["\n"] if self.acfg.stop_at_newline else [],
        )
        for attempt in itertools.count(1):
            index = self.chooser.acquire()
            try:
                response = self.policies[index].call(request)
            except RequestTimeout as exc:
                self.metrics.errors.labels("timeout").inc()
                self.chooser.mark_down(index)
                log.warning("%s (attempt %d); retrying on another server", exc, attempt)
                continue
            finally:
                self.chooser.release(index)
            self.metrics.messages_out.labels(request.KIND).inc()
            self.metrics.messages_in.labels(response.KIND).inc()
            self.metrics.policy_version.set(response.policy_version)
            return response

    def retrieve(self, task: str, variation: int, state: str) -> tuple[list[str], int] | None:
        """(tips, n), or None when the memory service is unreachable. After a failure the actor
        does not wait on it again for memory_retry_after_s: those turns go without tips at once."""
        if time.monotonic() < self._memory_down_until:
            return None
        try:
            result = self.memory.call(MemoryQuery(task=task, variation=variation, state=state))
        except (RequestTimeout, RemoteError) as exc:
            log.warning("memory unavailable (%s); going without tips for %.0fs", exc, self.acfg.memory_retry_after_s)
            self._memory_down_until = time.monotonic() + self.acfg.memory_retry_after_s
            return None
        assert isinstance(result, MemoryResult)
        return result.tips, result.count

    def report_episode(self, episode: Episode) -> None:
        """The episode to the memory service, which reflects on it and stores tips. Best effort,
        like retrieval: while the memory service counts as down (a retrieval or a report timed out
        within memory_retry_after_s) the report is dropped at once and counted in
        empo2_env_actor_errors_total{where="memory_report"}, so a missing service does not cost
        every episode the timeout."""
        if time.monotonic() < self._memory_down_until:
            self.metrics.errors.labels("memory_report").inc()
            return
        trajectory = episode.trajectory
        report = EpisodeReport(
            episode_id=trajectory.episode_id,
            task=trajectory.task,
            variation=trajectory.variation,
            task_description=episode.task_description,
            score=trajectory.score,
            observations=trajectory.observations,
            actions=trajectory.actions,
        )
        try:
            self.memory.call(report)
            self.metrics.messages_out.labels(report.KIND).inc()
        except (RequestTimeout, RemoteError) as exc:  # memory is best effort; the buffer is not
            self.metrics.errors.labels("memory_report").inc()
            log.warning(
                "episode report not delivered to memory: %s; not reporting for %.0fs",
                exc,
                self.acfg.memory_retry_after_s,
            )
            self._memory_down_until = time.monotonic() + self.acfg.memory_retry_after_s

    # --------------------------------------------------------------------------- training loop
    def run(self) -> None:
        """Play the replay buffer's assignments until the process is stopped."""
        try:
            self.open()
            self.wait_ready()
            log.info("%s ready; playing episodes", self.actor_id)
            report_s = 0.0  # the previous episode's memory report: it goes with the next trajectory
            while True:
                waited = time.perf_counter()
                assignment = self.playing = self._next_assignment()
                waited = time.perf_counter() - waited
                t0 = time.time()
                episode = self.play(assignment)
                trajectory = episode.trajectory
                trajectory.phase_seconds.update(assignment_wait=waited, memory_report=report_s)
                self._upload(trajectory)
                self.playing = None
                report_s = time.perf_counter()
                if self.cfg.replay_buffer.p_memory > 0:  # p = 0 (GRPO): no tip rollout ever reads the memory
                    self.report_episode(episode)
                report_s = time.perf_counter() - report_s
                self._record(episode)
                log.info(
                    "episode %s %s/%d mode=%s turns=%d chains=%d score=%.0f success=%s versions=%s (%.1fs)",
                    short_id(trajectory.episode_id),
                    trajectory.task,
                    trajectory.variation,
                    trajectory.mode,
                    trajectory.num_turns,
                    int(trajectory.chain_starts.sum()),
                    trajectory.score,
                    trajectory.success,
                    sorted(set(trajectory.policy_versions.tolist())),
                    time.time() - t0,
                )
        finally:
            self.close()

    def return_unfinished(self, ctx: zmq.Context) -> None:
        """Give the slot being played back to the buffer (a graceful stop), on a socket of the
        caller's thread: best effort, a buffer that does not answer re-issues it after its lease."""
        if self.playing is None:
            return
        a, self.playing = self.playing, None
        client = Client(ctx, self.cfg.endpoints.replay_buffer, RETURN_TIMEOUT_S)
        try:
            client.call(AssignmentReturn(group_id=a.group_id, slot=a.slot, actor_id=self.actor_id))
            log.info("%s returned its unfinished slot %s/%d", self.actor_id, short_id(a.group_id), a.slot)
        except (RequestTimeout, RemoteError) as exc:
            log.warning("%s could not return %s/%d: %s", self.actor_id, short_id(a.group_id), a.slot, exc)
        finally:
            client.close()

    def _next_assignment(self) -> Assignment:
        while True:
            reply = self._call_with_retry(self.buffer, AssignmentRequest(actor_id=self.actor_id))
            if isinstance(reply, Assignment):
                self.metrics.messages_in.labels(reply.KIND).inc()
                return reply
            time.sleep(reply.retry_after_s if isinstance(reply, Wait) else UNEXPECTED_REPLY_RETRY_S)

    def _upload(self, trajectory: Trajectory) -> None:
        """Deliver an episode; a refusal (ErrorReply: e.g. its slot was handed out again and filled,
        or the buffer restarted without its group) loses this episode only, and is counted."""
        try:
            reply = self._call_with_retry(self.buffer, trajectory, retries=self.acfg.upload_retries)
        except RemoteError as exc:
            self.metrics.errors.labels("upload_refused").inc()
            log.warning("episode %s refused by the replay buffer: %s", short_id(trajectory.episode_id), exc)
            return
        if not isinstance(reply, Ack):
            raise RuntimeError(f"buffer answered {reply.KIND} to a trajectory")
        # one line per stored episode: what an audit of the buffer's log checks against (tests/integration/test_fault_matrix.py)
        log.info("episode %s of group %s/%d acknowledged", trajectory.episode_id, trajectory.group_id, trajectory.slot)

    def _call_with_retry(self, client: Client, msg, retries: int | None = None):
        """client.call(msg), again after each timeout: at most `retries` attempts, or until it is
        answered when None (an actor has nothing to do without the buffer's assignments)."""
        for attempt in itertools.count(1):
            try:
                reply = client.call(msg)
                self.metrics.messages_out.labels(msg.KIND).inc()
                return reply
            except RequestTimeout as exc:
                self.metrics.errors.labels("timeout").inc()
                if retries is not None and attempt >= retries:
                    raise
                log.warning("%s (attempt %d); retrying", exc, attempt)

    def _record(self, episode: Episode) -> None:
        trajectory, stats, m = episode.trajectory, episode.stats, self.metrics
        m.episodes.labels(trajectory.mode).inc()
        m.episodes_success.labels(trajectory.mode).inc(int(trajectory.success))
        m.env_steps.inc(trajectory.num_turns)
        m.invalid_actions.inc(stats.invalid_actions)
        m.chains.inc(int(trajectory.chain_starts.sum()))  # turn 0 and each history trim: the learner's sequences
        m.memory_fallbacks.inc(stats.memory_fallbacks)
        m.tips_shown.inc(stats.tips_shown)
        m.last_score.set(trajectory.score)
        for s in stats.step_seconds:
            m.step_seconds.observe(s)


class EnvActor:
    """An env actor process: env_actor.envs_per_actor EnvWorkers, one ScienceWorld JVM each,
    sharing the metrics and the server chooser. While one env waits on generation the others
    step, so one process keeps several episodes in flight.

    run() plays the replay buffer's assignments in one thread per env (the process's main);
    play_all() plays a given list of assignments on the pool, for an evaluation driver."""

    def __init__(self, cfg: PipelineConfig):
        self.metrics = EnvActorMetrics()
        chooser = ServerChooser(
            len(cfg.endpoints.policy_servers), cfg.env_actor.server_selection, cfg.env_actor.policy_retry_after_s
        )
        self.workers = [EnvWorker(cfg, self.metrics, slot, chooser) for slot in range(cfg.env_actor.envs_per_actor)]
        self._threads: dict[int, threading.Thread] = {}  # slot -> the thread of run() playing on it

    def open(self) -> None:
        """Every worker's env, built one after the other: transformers' lazy imports are not thread-safe."""
        for worker in self.workers:
            worker.open()

    def wait_ready(
        self,
        buffer: bool = True,
        memory: bool = False,
        timeout_s: float | None = None,
        on_wait: Callable[[str, float], None] | None = None,
    ) -> None:
        """EnvWorker.wait_ready for the pool: the servers answer every worker once they answer one."""
        self.workers[0].wait_ready(buffer, memory, timeout_s, on_wait)

    def play_all(
        self,
        assignments: Sequence[Assignment],
        temperature: float | None = None,
        on_episode: Callable[[int, Episode], None] | None = None,
    ) -> list[Episode]:
        """Play every assignment, the pool's envs concurrently (each takes the next one left), and
        return the episodes in the order of `assignments`. `on_episode(index, episode)` runs in the
        playing env's thread as each one ends (an evaluation records it there, so an interruption
        loses only the episodes in flight). After a failure the envs take no new assignment; the
        first failure is raised once all have stopped."""
        self.open()
        todo: queue.SimpleQueue[tuple[int, Assignment]] = queue.SimpleQueue()
        for item in enumerate(assignments):
            todo.put(item)
        episodes: list[Episode | None] = [None] * len(assignments)
        failures: list[BaseException] = []

        def drain(worker: EnvWorker) -> None:
            while not failures:
                try:
                    i, assignment = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    episodes[i] = worker.play(assignment, temperature)
                    if on_episode is not None:
                        on_episode(i, episodes[i])
                except BaseException as exc:  # noqa: BLE001  (raised in the caller's thread below)
                    failures.append(exc)

        threads = [threading.Thread(target=drain, args=(w,), name=w.actor_id, daemon=True) for w in self.workers]
        self._threads = dict(enumerate(threads))  # close() leaves a worker still playing (interrupted) alone
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failures:
            raise failures[0]
        return episodes

    def close(self) -> None:
        """Return every unfinished slot, then close the workers' envs and sockets, except those of
        a worker still playing in a run() thread: its sockets belong to that thread (the process's
        exit ends it and its JVM)."""
        for worker in self.workers:
            worker.return_unfinished(zmq.Context.instance())
        for slot, worker in enumerate(self.workers):
            thread = self._threads.get(slot)
            if thread is None or not thread.is_alive():
                worker.close()

    def run(self) -> None:
        if len(self.workers) == 1:
            return self.workers[0].run()
        failures: list[BaseException] = []
        self.open()

        def play(worker: EnvWorker) -> None:
            try:
                worker.run()
            except BaseException as exc:  # noqa: BLE001  (reported below: the process must end)
                failures.append(exc)
                log.exception("%s stopped", worker.actor_id)

        self._threads = {
            slot: threading.Thread(target=play, args=(w,), name=w.actor_id, daemon=True)
            for slot, w in enumerate(self.workers)
        }
        for t in self._threads.values():
            t.start()
        while all(t.is_alive() for t in self._threads.values()):
            time.sleep(THREAD_CHECK_S)
        raise RuntimeError(f"an env thread stopped: {failures[0] if failures else 'unknown'}")


def main(argv: list[str] | None = None, cfg: PipelineConfig | None = None) -> None:
    cfg = cfg or role_config("empo2-env-actor", argv)
    run_role(cfg, "env_actor", EnvActor, index=lambda cfg: cfg.env_actor.index)


if __name__ == "__main__":
    main()
