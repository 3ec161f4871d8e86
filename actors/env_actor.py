"""Env actor: plays ScienceWorld episodes with the served policy and streams them to the buffer.

Sockets (all DEALER clients, request/reply):
  replay buffer : AssignmentRequest -> Assignment | Wait ; Trajectory -> Ack (persisted)
  policy servers: GenerateRequest -> GenerateResponse (round-robin over endpoints.policy_servers)
  memory service: MemoryQuery -> MemoryResult ; EpisodeReport -> Ack   (best effort, bounded)

The episode logic (EpisodeRunner) takes its policy and memory as callables, so it runs without
sockets in tests; ActorProcess owns the sockets, retries and metrics.

Run: `empo2-env-actor env_actor.index=0 [key=value ...]`.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import zmq

from actors.prompts import PromptBuilder
from common.metrics import EnvActorMetrics
from common.model_prep import resolve_model
from common.process import run_role
from common.scienceworld import ScienceWorld, most_similar_action
from pipeline.config import PipelineConfig
from protocol import Client, RemoteError, RequestTimeout
from protocol.messages import (
    OFF_POLICY,
    ON_POLICY_TIPS,
    Ack,
    Assignment,
    AssignmentRequest,
    EpisodeReport,
    GenerateRequest,
    GenerateResponse,
    MemoryQuery,
    MemoryResult,
    Trajectory,
    Wait,
)
from protocol.transport import wait_until_ready

log = logging.getLogger("env_actor")

TIP_MODES = (ON_POLICY_TIPS, OFF_POLICY)

# (prompt token ids, seed) -> response;   (task, variation, state) -> (tips, n) or None if unreachable
GenerateFn = Callable[[np.ndarray, int], GenerateResponse]
RetrieveFn = Callable[[str, int, str], "tuple[list[str], int] | None"]


@dataclass
class Turn:
    prompt_ids: np.ndarray
    tip_spans: list[tuple[int, int]]
    response: GenerateResponse
    num_memories: int
    state: str
    action: str


@dataclass
class EpisodeStats:
    invalid_actions: int = 0
    memory_fallbacks: int = 0
    tips_shown: int = 0
    step_seconds: list[float] = field(default_factory=list)


class EpisodeRunner:
    def __init__(
        self,
        env: ScienceWorld,
        prompts: PromptBuilder,
        max_steps: int,
        max_steps_per_task: dict[str, int] | None = None,
    ):
        self.env, self.prompts = env, prompts
        self.max_steps, self.max_steps_per_task = max_steps, dict(max_steps_per_task or {})

    def step_limit(self, task: str) -> int:
        return self.max_steps_per_task.get(task, self.max_steps)

    def play(
        self, a: Assignment, actor_id: str, generate: GenerateFn, retrieve: RetrieveFn
    ) -> tuple[Trajectory, EpisodeStats]:
        stats = EpisodeStats()
        result = self.env.reset(a.task, a.variation)
        task = self.env.task_description
        history: list[tuple[str, str]] = []
        turns: list[Turn] = []
        for t in range(self.step_limit(a.task)):
            t0 = time.perf_counter()
            tips, n = [], 0
            if a.mode in TIP_MODES:
                found = retrieve(a.task, a.variation, result.state)
                if found is None:
                    stats.memory_fallbacks += 1
                else:
                    tips, n = found
                    stats.tips_shown += len(tips)
            prompt = self.prompts.build(task, history, result.state, tips)
            response = generate(prompt.token_ids, a.seed * 1000 + t)
            action, mapped = most_similar_action(response.text, result.valid_actions)
            stats.invalid_actions += int(mapped)
            turns.append(Turn(prompt.token_ids, prompt.tip_spans, response, n, result.state, action))
            result = self.env.step(action)
            history.append((action, result.observation))
            stats.step_seconds.append(time.perf_counter() - t0)
            if result.done:
                break
        return self._trajectory(a, actor_id, turns, result.score, result.done), stats

    @staticmethod
    def _trajectory(a: Assignment, actor_id: str, turns: list[Turn], score: float, done: bool) -> Trajectory:
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
        )


def open_episode_runner(cfg: PipelineConfig) -> EpisodeRunner:
    """The env actor's episode logic over a fresh ScienceWorld; the caller closes runner.env (a JVM)."""
    from transformers import AutoTokenizer

    acfg = cfg.env_actor
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.model.name, cfg.model.cache_dir or None))
    longest = max([acfg.max_steps, *acfg.max_steps_per_task.values()])
    env = ScienceWorld(acfg.simplification, step_limit=max(100, longest + 1))  # our limit ends episodes, not the env's
    return EpisodeRunner(env, PromptBuilder(tokenizer, acfg.history_window), acfg.max_steps, acfg.max_steps_per_task)


class ServerChooser:
    """Which policy server gets the next request: the one with the fewest requests in flight from
    this process (ties and "round_robin" rotate). Shared by the env threads of one process."""

    def __init__(self, num_servers: int, policy: str):
        if policy not in ("least_loaded", "round_robin"):
            raise ValueError(f"env_actor.server_selection must be least_loaded|round_robin, got {policy!r}")
        self.in_flight = [0] * num_servers
        self.policy = policy
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            start = next(self._turn) % len(self.in_flight)
            order = [(start + k) % len(self.in_flight) for k in range(len(self.in_flight))]
            index = min(order, key=lambda i: self.in_flight[i]) if self.policy == "least_loaded" else start
            self.in_flight[index] += 1
            return index

    def release(self, index: int) -> None:
        with self._lock:
            self.in_flight[index] -= 1


class ActorProcess:
    """One env's episode loop and its sockets (ZeroMQ sockets are per thread)."""

    def __init__(
        self,
        cfg: PipelineConfig,
        metrics: EnvActorMetrics | None = None,
        slot: int = 0,
        chooser: ServerChooser | None = None,
    ):
        self.cfg, self.acfg = cfg, cfg.env_actor
        self.actor_id = f"actor{self.acfg.index}" + (f".{slot}" if slot else "")
        self.metrics = metrics or EnvActorMetrics()
        ctx = zmq.Context.instance()
        self.buffer = Client(ctx, cfg.endpoints.replay_buffer, self.acfg.buffer_timeout_s)
        self.memory = Client(ctx, cfg.endpoints.memory_service, self.acfg.memory_timeout_s)
        self.policies = [Client(ctx, ep, self.acfg.generate_timeout_s) for ep in cfg.endpoints.policy_servers]
        self.chooser = chooser or ServerChooser(len(self.policies), self.acfg.server_selection)
        self._request_ids = itertools.count()
        self._memory_down_until = 0.0  # monotonic time until which retrieval is skipped

    def run(self, runner: EpisodeRunner | None = None) -> None:
        runner = runner or open_episode_runner(self.cfg)
        try:
            for client in [self.buffer, *self.policies]:
                pong = wait_until_ready(
                    client,
                    self.actor_id,
                    self.acfg.startup_timeout_s,
                    on_wait=lambda left, ep=client.endpoint: log.info("waiting for %s (%.0fs left)", ep, left),
                )
                self.metrics.policy_version.set(max(pong.policy_version, 0))
            log.info("%s ready; playing episodes", self.actor_id)
            while True:
                assignment = self._next_assignment()
                t0 = time.time()
                trajectory, stats = runner.play(assignment, self.actor_id, self._generate, self._retrieve)
                self._upload(trajectory)
                self._report_to_memory(trajectory, runner.env.task_description)
                self._record(trajectory, stats)
                log.info(
                    "episode %s %s/%d mode=%s turns=%d score=%.0f versions=%s (%.1fs)",
                    trajectory.episode_id[:8],
                    trajectory.task,
                    trajectory.variation,
                    trajectory.mode,
                    trajectory.num_turns,
                    trajectory.score,
                    sorted(set(trajectory.policy_versions.tolist())),
                    time.time() - t0,
                )
        finally:
            runner.env.close()

    def _next_assignment(self) -> Assignment:
        while True:
            reply = self._call_with_retry(self.buffer, AssignmentRequest(actor_id=self.actor_id))
            if isinstance(reply, Assignment):
                self.metrics.messages_in.labels(reply.KIND).inc()
                return reply
            time.sleep(reply.retry_after_s if isinstance(reply, Wait) else 1.0)

    def _generate(self, prompt_ids: np.ndarray, seed: int) -> GenerateResponse:
        """On the server the chooser picks; after a timeout the retry goes to the next one."""
        request = GenerateRequest(
            request_id=f"{self.actor_id}-{next(self._request_ids)}",
            prompt_token_ids=prompt_ids,
            max_tokens=self.acfg.max_action_tokens,
            temperature=self.acfg.temperature,
            seed=seed,
            stop=["\n"],
        )
        for attempt in itertools.count(1):
            index = self.chooser.acquire()
            try:
                response = self.policies[index].call(request)
            except RequestTimeout as exc:
                self.metrics.errors.labels("timeout").inc()
                log.warning("%s (attempt %d); retrying on the next server", exc, attempt)
                continue
            finally:
                self.chooser.release(index)
            self.metrics.messages_out.labels(request.KIND).inc()
            self.metrics.messages_in.labels(response.KIND).inc()
            self.metrics.policy_version.set(response.policy_version)
            return response

    def _retrieve(self, task: str, variation: int, state: str):
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

    def _upload(self, trajectory: Trajectory) -> None:
        reply = self._call_with_retry(self.buffer, trajectory, retries=self.acfg.upload_retries)
        if not isinstance(reply, Ack):
            raise RuntimeError(f"buffer answered {reply.KIND} to a trajectory")

    def _report_to_memory(self, trajectory: Trajectory, task_description: str) -> None:
        """Best effort, like retrieval: while the memory service counts as down (a retrieval or a
        report timed out within memory_retry_after_s) the report is dropped at once, so a missing
        service does not cost every episode the timeout."""
        if time.monotonic() < self._memory_down_until:
            self.metrics.errors.labels("memory_report").inc()
            return
        report = EpisodeReport(
            episode_id=trajectory.episode_id,
            task=trajectory.task,
            variation=trajectory.variation,
            task_description=task_description,
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

    def _call_with_retry(self, client: Client, msg, retries: int = 1_000_000):
        for attempt in itertools.count(1):
            try:
                reply = client.call(msg)
                self.metrics.messages_out.labels(msg.KIND).inc()
                return reply
            except RequestTimeout as exc:
                self.metrics.errors.labels("timeout").inc()
                if attempt >= retries:
                    raise
                log.warning("%s (attempt %d); retrying", exc, attempt)

    def _record(self, trajectory: Trajectory, stats: EpisodeStats) -> None:
        m = self.metrics
        m.episodes.labels(trajectory.mode).inc()
        m.env_steps.inc(trajectory.num_turns)
        m.invalid_actions.inc(stats.invalid_actions)
        m.memory_fallbacks.inc(stats.memory_fallbacks)
        m.tips_shown.inc(stats.tips_shown)
        m.last_score.set(trajectory.score)
        for s in stats.step_seconds:
            m.step_seconds.observe(s)


class ActorPool:
    """An env actor process: env_actor.envs_per_actor episode loops in threads, one ScienceWorld
    JVM each, sharing the metrics and the server chooser. While one env waits on generation the
    others step, so one process keeps several episodes in flight."""

    def __init__(self, cfg: PipelineConfig):
        self.metrics = EnvActorMetrics()
        chooser = ServerChooser(len(cfg.endpoints.policy_servers), cfg.env_actor.server_selection)
        self.actors = [ActorProcess(cfg, self.metrics, slot, chooser) for slot in range(cfg.env_actor.envs_per_actor)]

    def run(self) -> None:
        if len(self.actors) == 1:
            return self.actors[0].run()
        failures: list[BaseException] = []

        # built one after the other: transformers' lazy imports are not thread-safe
        runners = [open_episode_runner(actor.cfg) for actor in self.actors]

        def play(actor: ActorProcess, runner: EpisodeRunner) -> None:
            try:
                actor.run(runner)
            except BaseException as exc:  # noqa: BLE001  (reported below: the process must end)
                failures.append(exc)
                log.exception("%s stopped", actor.actor_id)

        threads = [
            threading.Thread(target=play, args=(a, r), name=a.actor_id, daemon=True)
            for a, r in zip(self.actors, runners)
        ]
        for t in threads:
            t.start()
        while all(t.is_alive() for t in threads):
            time.sleep(0.5)
        raise RuntimeError(f"an env thread stopped: {failures[0] if failures else 'unknown'}")


def main(argv: list[str] | None = None) -> None:
    run_role(argv, "env_actor", ActorPool, index=lambda cfg: cfg.env_actor.index)


if __name__ == "__main__":
    main()
