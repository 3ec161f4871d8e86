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

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

import zmq

from actors.env_actor.config import EnvActorConfig
from actors.env_actor.episode import Episode
from actors.env_actor.lease import new_incarnation
from actors.env_actor.turn_format import ACTION, TurnFormat
from actors.env_actor.worker import EnvWorker, ServerChooser
from common.config import EnvConfig, RunFacts, SgeConfig
from common.metrics import EnvActorMetrics
from common.process import run_role
from protocol.messages import (
    Assignment,
)

# How often the env actor process checks that all its env threads still play.
THREAD_CHECK_S = 0.5

log = logging.getLogger("env_actor")


class EnvActor:
    """An env actor process: env_actor.envs_per_actor EnvWorkers, one ScienceWorld JVM each,
    sharing the metrics and the server chooser. While one env waits on generation the others
    step, so one process keeps several episodes in flight.

    run() plays the replay buffer's assignments in one thread per env (the process's main);
    play_all() plays a given list of assignments on the pool, for an evaluation driver."""

    def __init__(
        self,
        env_actor: EnvActorConfig,
        env: EnvConfig,
        run: RunFacts,
        sge: SgeConfig | None = None,
        turn_format: TurnFormat = ACTION,
    ):
        self.metrics = EnvActorMetrics()
        chooser = ServerChooser(
            len(run.endpoints.policy_servers), env_actor.server_selection, env_actor.policy_retry_after_s
        )
        self.incarnation = new_incarnation()  # this process's: a restarted actor releases its predecessor's leases
        self.workers = [
            EnvWorker(
                env_actor,
                env,
                run,
                self.metrics,
                slot,
                chooser,
                sge=sge,
                turn_format=turn_format,
                incarnation=self.incarnation,
            )
            for slot in range(env_actor.envs_per_actor)
        ]
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
        # one keep-alive thread renews every env's slot; its first round announces the incarnation
        keeper = self.workers[0].lease_keeper(self.workers).start()
        self.open()

        def play(worker: EnvWorker) -> None:
            try:
                worker.run(keep_leases=False)
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
        keeper.stop(0)  # the process ends: its leases lapse unless returned (close)
        raise RuntimeError(f"an env thread stopped: {failures[0] if failures else 'unknown'}")


def main(env_actor: EnvActorConfig, env: EnvConfig, sge: SgeConfig, run: RunFacts) -> None:
    run_role(f"env_actor{env_actor.index}", run, lambda: EnvActor(env_actor, env, run, sge))
