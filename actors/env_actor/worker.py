"""One env's sockets, retries and metrics around the episode logic (EnvWorker), and the choice of
policy server for each request (ServerChooser). The worker's client API is what evaluation
drivers use too."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import zmq

from actors.env_actor.config import EnvActorConfig
from actors.env_actor.episode import Episode, EpisodeRunner, open_episode_runner
from actors.env_actor.lease import LeaseKeeper, LeaseLost, new_incarnation
from actors.env_actor.strategy import STRATEGY_CLOSE, format_reflection_block
from actors.env_actor.turn_format import ACTION, TurnFormat
from common.config import EnvConfig, RunFacts, SgeConfig
from common.heartbeat import beat
from common.logs import short_id
from common.metrics import EnvActorMetrics
from common.scienceworld import ScienceWorld
from protocol import Client, RemoteError, RequestTimeout
from protocol.messages import (
    Ack,
    Assignment,
    AssignmentRequest,
    AssignmentReturn,
    EpisodeReport,
    GenerateResponse,
    MemoryQuery,
    MemoryResult,
    StrategyQuery,
    StrategyResult,
    Trajectory,
    Wait,
)
from protocol.transport import wait_until_ready

# The buffer answered an AssignmentRequest with neither an Assignment nor a Wait: ask again after this.
UNEXPECTED_REPLY_RETRY_S = 1.0
# A policy server answering not_ready (starting, or waiting for the run's newest weights) is passed
# over like a timed-out one; with every server so, the turn waits this long between tries, and logs
# every NOT_READY_LOG_EVERY-th
NOT_READY_RETRY_S = 1.0
NOT_READY_LOG_EVERY = 30

# How long a stopping actor waits for the buffer to take back its unfinished slot.
RETURN_TIMEOUT_S = 2.0

log = logging.getLogger("env_actor")


class ServerChooser:
    """Which policy server gets the next request: the one with the fewest requests in flight from
    this process (ties and "round_robin" rotate). Shared by the env threads of one process.

    A server whose request timed out (down or hung, e.g. SIGSTOPped) is passed over for
    `retry_after_s` (env_actor.policy_retry_after_s) while another one is up, so the retry and
    the requests that follow fail over at once instead of each waiting out the timeout. A server
    that answered with an older policy version than another did is passed over likewise while a
    current one is up (the staleness rules handle what it played before)."""

    def __init__(self, num_servers: int, policy: str, retry_after_s: float):  # env_actor.server_selection (validated)
        self.in_flight = [0] * num_servers
        self.policy = policy
        self.retry_after_s = retry_after_s
        self.down_until = [0.0] * num_servers  # monotonic time until which a timed-out server is passed over
        # the policy version each server answered with last, and when: a server behind the newest one seen
        # (its background push still under way, learner.background_push) is passed over while another is
        # current, for retry_after_s at most (then its next answer says where it is)
        self.versions = [-1] * num_servers
        self.version_seen = [0.0] * num_servers
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def answered(self, index: int, version: int) -> None:
        with self._lock:
            self.versions[index], self.version_seen[index] = version, time.monotonic()

    def acquire(self) -> int:
        with self._lock:
            start = next(self._turn) % len(self.in_flight)
            order = [(start + k) % len(self.in_flight) for k in range(len(self.in_flight))]
            now = time.monotonic()
            order = [i for i in order if self.down_until[i] <= now] or order  # all down: try them anyway
            newest = max(self.versions)
            current = [
                i for i in order if self.versions[i] >= newest or now - self.version_seen[i] > self.retry_after_s
            ]
            order = current or order
            index = min(order, key=lambda i: self.in_flight[i]) if self.policy == "least_loaded" else order[0]
            self.in_flight[index] += 1
            return index

    def any_up(self) -> bool:
        with self._lock:
            return any(until <= time.monotonic() for until in self.down_until)

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
        env_actor: EnvActorConfig,
        env: EnvConfig,
        run: RunFacts,
        metrics: EnvActorMetrics | None = None,
        slot: int = 0,
        chooser: ServerChooser | None = None,
        runner: EpisodeRunner | None = None,
        sge: SgeConfig | None = None,
        turn_format: TurnFormat = ACTION,
        incarnation: str | None = None,
    ):
        self.acfg, self.env_cfg, self.run_facts = env_actor, env, run
        # this process's incarnation (actors/env_actor/lease.py): shared by its envs, new at each start
        self.incarnation = incarnation or new_incarnation()
        self.sge = sge if sge is not None and sge.enabled else None
        self.turn_format = turn_format  # the runner's, when open() builds it
        self.actor_id = f"actor{self.acfg.index}" + (f".{slot}" if slot else "")
        self.metrics = metrics or EnvActorMetrics()
        ctx = zmq.Context.instance()
        self.buffer = Client(ctx, run.endpoints.replay_buffer, self.acfg.buffer_timeout_s)
        self.memory = Client(ctx, run.endpoints.memory_service, self.acfg.memory_timeout_s)
        self.policies = [Client(ctx, ep, self.acfg.generate_timeout_s) for ep in run.endpoints.policy_servers]
        self.chooser = chooser or ServerChooser(
            len(self.policies), self.acfg.server_selection, self.acfg.policy_retry_after_s
        )
        self.runner = runner  # the episode logic over this worker's env; open() builds it when None
        self._request_ids = itertools.count()
        self._memory_down_until = 0.0  # monotonic time until which retrieval is skipped
        self.playing: Assignment | None = None  # run()'s slot until its trajectory is acknowledged
        self.lease_lost: Assignment | None = None  # set by the lease keeper: `playing` is no longer ours

    # ------------------------------------------------------------------------------ client API
    def open(self) -> EpisodeRunner:
        """The episode logic over this worker's own ScienceWorld, built on first use."""
        if self.runner is None:
            self.runner = open_episode_runner(self.acfg, self.env_cfg, self.run_facts, self.sge, self.turn_format)
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
        timeout_s = self.run_facts.startup_timeout_s if timeout_s is None else timeout_s
        clients = [*([self.buffer] if buffer else []), *self.policies, *([self.memory] if memory else [])]
        for client in clients:

            def waiting(left: float, endpoint: str = client.endpoint) -> None:
                beat(self.actor_id)  # the start-up wait loop turns: progress (common/heartbeat.py)
                log.info("waiting for %s (%.0fs left)", endpoint, left)
                if on_wait is not None:
                    on_wait(endpoint, left)

            pong = wait_until_ready(client, self.actor_id, timeout_s, on_wait=waiting)
            self.metrics.policy_version.set(max(pong.policy_version, 0))

    def play(self, assignment: Assignment, temperature: float | None = None) -> Episode:
        """One episode of `assignment` (task, variation, mode, seed) with the served policy,
        sampling at `temperature` (default: the assignment's, else env_actor.temperature); in the tip
        modes every turn asks the memory service for tips, a guided one shows its guidance. With SGE
        the turns due write a strategy first, at the assignment's strategy temperature (a training
        member's; an evaluation's: the actions' temperature), after the group's reflection when the
        assignment comes from the buffer. Nothing is uploaded or reported: run() does both."""
        runner = self.open()
        temperature = assignment.temperature if temperature is None else temperature
        turn = runner.turn_format
        sge_generate, reflection = None, ""
        if self.sge is not None:
            strategy_temperature = assignment.strategy_temperature
            if strategy_temperature is None:  # an evaluation's episode: no spread, no group to reflect for
                strategy_temperature = self.acfg.temperature if temperature is None else temperature
            elif self.sge.reflection:
                reflection = self.reflection(assignment)

            def generate_strategy(prompt_ids: np.ndarray, seed: int) -> GenerateResponse:
                return self.generate(
                    prompt_ids, seed, strategy_temperature, self.sge.max_strategy_tokens, [STRATEGY_CLOSE]
                )

            def generate_action(prompt_ids: np.ndarray, seed: int) -> GenerateResponse:
                # after the strategy's line break a small model often starts with another: the action's stop
                return self.generate(prompt_ids, seed, temperature, turn.max_tokens, turn.stop, min_tokens=1)

            sge_generate = (generate_strategy, generate_action)

        trajectory, stats = runner.play(
            assignment,
            self.actor_id,
            lambda prompt_ids, seed: self.generate(prompt_ids, seed, temperature, turn.max_tokens, turn.stop),
            self.retrieve,
            sge_generate,
            reflection,
        )
        return Episode(trajectory, runner.env.task_description, stats)

    def generate(
        self,
        prompt_ids: np.ndarray,
        seed: int,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        min_tokens: int = 0,
    ) -> GenerateResponse:
        """The next action's text from a policy server (or another response's: a turn format's, SGE's
        strategy, with its cap and stop strings): the chooser picks the server; after a timeout or a
        not_ready answer (a server starting, or waiting for the run's newest weights) that server is
        passed over for env_actor.policy_retry_after_s and the retry goes to another one.
        `temperature` defaults to env_actor.temperature. LeaseLost if the lease keeper found that
        the slot being played (run()'s) is no longer this actor's: the episode is dropped."""
        lost = self.lease_lost
        if lost is not None and lost is self.playing:
            raise LeaseLost(f"slot {short_id(lost.group_id)}/{lost.slot} was handed out again or filled")
        request = self.acfg.action_request(
            f"{self.actor_id}-{next(self._request_ids)}", prompt_ids, seed, temperature, max_tokens, stop, min_tokens
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
            except RemoteError as exc:
                if exc.reason != "not_ready":
                    raise
                # a server (re)starting: its engine loads, or it waits for the run's newest weights
                self.metrics.errors.labels("not_ready").inc()
                self.chooser.mark_down(index)
                if attempt == 1 or attempt % NOT_READY_LOG_EVERY == 0:
                    log.info("%s (attempt %d); trying another server", exc, attempt)
                if not self.chooser.any_up():
                    time.sleep(NOT_READY_RETRY_S)
                continue
            finally:
                self.chooser.release(index)
            beat(self.actor_id)  # a turn's action: progress; a generation that never answers is not
            self.chooser.answered(index, response.policy_version)
            self.metrics.messages_out.labels(request.KIND).inc()
            self.metrics.messages_in.labels(response.KIND).inc()
            self.metrics.policy_version.set(response.policy_version)
            return response

    def retrieve(self, task: str, variation: int, state: str, inventory: str = "") -> tuple[list[str], int] | None:
        """(tips, n), or None when the memory service is unreachable. After a failure the actor
        does not wait on it again for memory_retry_after_s: those turns go without tips at once."""
        if time.monotonic() < self._memory_down_until:
            return None
        try:
            result = self.memory.call(MemoryQuery(task=task, variation=variation, state=state, inventory=inventory))
        except (RequestTimeout, RemoteError) as exc:
            log.warning("memory unavailable (%s); going without tips for %.0fs", exc, self.acfg.memory_retry_after_s)
            self._memory_down_until = time.monotonic() + self.acfg.memory_retry_after_s
            return None
        assert isinstance(result, MemoryResult)
        return result.tips, result.count

    def reflection(self, a: Assignment) -> str:
        """SGE's reflection block for the group of `a`: the earlier strategies of its task with their
        scores, the same for every member (the memory service keeps the first member's answer). ""
        when there are none yet, or the memory service does not answer (counted, like a retrieval)."""
        if time.monotonic() < self._memory_down_until:
            self.metrics.reflections.labels("unavailable").inc()
            return ""
        try:
            result = self.memory.call(StrategyQuery(group_id=a.group_id, task=a.task, variation=a.variation))
        except (RequestTimeout, RemoteError) as exc:
            log.warning("no reflection (%s); memory passed over for %.0fs", exc, self.acfg.memory_retry_after_s)
            self._memory_down_until = time.monotonic() + self.acfg.memory_retry_after_s
            self.metrics.reflections.labels("unavailable").inc()
            return ""
        assert isinstance(result, StrategyResult)
        self.metrics.reflections.labels("shown" if result.strategies else "empty").inc()
        return format_reflection_block(result.strategies, result.scores) if result.strategies else ""

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
            inventories=trajectory.inventories_before(),  # each observed state's
            strategy=next((s for s in trajectory.strategies if s), ""),
            strategy_temperature=trajectory.strategy_temperature,
            reflect=self.run_facts.memory_in_use,  # tips only where some rollouts read them
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
    def run(self, keep_leases: bool = True) -> None:
        """Play the replay buffer's assignments until the process is stopped. `keep_leases`: renew
        the slot being played from a thread of this worker's own (a lone worker; EnvActor renews all
        its workers' in one thread and passes False)."""
        keeper = self.lease_keeper([self]).start() if keep_leases else None
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
                try:
                    episode = self.play(assignment)
                except LeaseLost as exc:  # the slot lapsed and went to another actor, or was filled
                    self.metrics.errors.labels("lease_lost").inc()
                    log.warning("%s: episode of %s dropped: %s", self.actor_id, short_id(assignment.group_id), exc)
                    self.playing = self.lease_lost = None
                    continue
                trajectory = episode.trajectory
                trajectory.phase_seconds.update(assignment_wait=waited, memory_report=report_s)
                self._upload(trajectory)
                self.playing = None
                report_s = time.perf_counter()
                # p = 0 (GRPO): no tip rollout ever reads the memory; SGE's reflection reads its strategies
                if self.run_facts.memory_in_use or self.sge is not None and self.sge.reflection:
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
            if keeper is not None:
                keeper.stop(RETURN_TIMEOUT_S)
            self.close()

    def lease_keeper(self, holders: Sequence[EnvWorker]) -> LeaseKeeper:
        """The keep-alive thread for `holders`' slots (actors/env_actor/lease.py), not yet started."""
        return LeaseKeeper(
            holders,
            self.run_facts.endpoints.replay_buffer,
            self.acfg.lease_renew_s,
            self.acfg.buffer_timeout_s,
            on_error=lambda where: self.metrics.errors.labels(where).inc(),
        )

    def return_unfinished(self, ctx: zmq.Context) -> None:
        """Give the slot being played back to the buffer (a graceful stop), on a socket of the
        caller's thread: best effort, a buffer that does not answer re-issues it after its lease."""
        if self.playing is None:
            return
        a, self.playing = self.playing, None
        client = Client(ctx, self.run_facts.endpoints.replay_buffer, RETURN_TIMEOUT_S)
        try:
            client.call(
                AssignmentReturn(group_id=a.group_id, slot=a.slot, actor_id=self.actor_id, incarnation=self.incarnation)
            )
            log.info("%s returned its unfinished slot %s/%d", self.actor_id, short_id(a.group_id), a.slot)
        except (RequestTimeout, RemoteError) as exc:
            log.warning("%s could not return %s/%d: %s", self.actor_id, short_id(a.group_id), a.slot, exc)
        finally:
            client.close()

    def _next_assignment(self) -> Assignment:
        while True:
            request = AssignmentRequest(actor_id=self.actor_id, incarnation=self.incarnation)
            reply = self._call_with_retry(self.buffer, request)
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
        answered when None (an actor has nothing to do without the buffer's assignments). Each
        attempt, answered (a Wait too) or timed out, is progress of this wait loop: a buffer that does
        not answer is found by its own heartbeat (launch.hang_timeout_s > env_actor.buffer_timeout_s)."""
        for attempt in itertools.count(1):
            beat(self.actor_id)
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
        m.turns.labels(trajectory.mode).inc(trajectory.num_turns)
        m.tip_turns.labels(trajectory.mode).inc(stats.tip_turns)
        m.strategies.inc(len(stats.strategy_tokens))
        for n in stats.strategy_tokens:
            m.strategy_tokens.observe(n)
        m.last_score.set(trajectory.score)
        for s in stats.step_seconds:
            m.step_seconds.observe(s)
