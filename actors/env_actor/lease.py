"""The keep-alive of an env actor's assignments: one thread per actor process renews the slot each of
its envs plays (LeaseRenewal), every env_actor.lease_renew_s, on a socket of its own.

The lease thus lasts as long as the process lives, not as long as a turn may take (a generation
waits up to env_actor.generate_timeout_s, 300 s, and is retried on another server): the buffer's
lease_ttl_s only has to cover a few renewal periods. A killed actor stops renewing and its slots
lapse within replay_buffer.lease_ttl_s; a restarted one announces its new incarnation in its first
renewal, sent before its envs have even loaded, and the buffer releases its predecessor's leases at
once. A hung env (the process lives, the episode does not move) is not this thread's business: the
launcher's hang detection restarts its process (launch.hang_timeout_s), which releases its leases.

A renewal refused lease_lost (the slot lapsed and went to another actor, or another episode filled
it, or a restarted buffer no longer knows its group) marks the env's assignment lost: the env drops
the episode at its next turn (EnvWorker.generate raises LeaseLost) and asks for a new slot.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Protocol

import zmq

from common.logs import short_id
from protocol import Client, RemoteError, RequestTimeout
from protocol.messages import Assignment, LeaseRenewal

log = logging.getLogger("env_actor")


def new_incarnation() -> str:
    """A process's incarnation id: random, so a restarted actor (the same actor id) differs."""
    return uuid.uuid4().hex


class LeaseLost(RuntimeError):
    """The slot being played is no longer this actor's (LeaseRenewal refused lease_lost)."""


class Holder(Protocol):
    """What the keeper reads of an env (EnvWorker): who it is, what it plays; it sets lease_lost."""

    actor_id: str
    incarnation: str
    playing: Assignment | None
    lease_lost: Assignment | None


class LeaseKeeper:
    """Renews the slots of `holders` every `renew_s` until stop(); the first round goes out at once
    (it announces the process's incarnation). Each renewal waits at most `timeout_s` for the buffer;
    one that gets no answer is counted and the next round tries again (the lease outlives several)."""

    def __init__(
        self,
        holders: Sequence[Holder],
        endpoint: str,
        renew_s: float,
        timeout_s: float,
        ctx: zmq.Context | None = None,
        on_error=None,
    ):
        self.holders, self.endpoint, self.renew_s, self.timeout_s = list(holders), endpoint, renew_s, timeout_s
        self.ctx = ctx or zmq.Context.instance()
        # on_error(where): a renewal refused or unanswered, for the actor's error counter (a lost lease is
        # counted by the env that drops its episode)
        self.on_error = on_error
        self.rounds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LeaseKeeper:
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        client = Client(self.ctx, self.endpoint, self.timeout_s)
        try:
            while not self._stop.is_set():
                self.renew_all(client)
                self.rounds += 1
                self._stop.wait(self.renew_s)
        finally:
            client.close()

    def renew_all(self, client: Client) -> None:
        """One round: a renewal per env, for its slot (or none: the incarnation alone)."""
        for holder in self.holders:
            if self._stop.is_set():
                return
            playing = holder.playing
            msg = LeaseRenewal(
                actor_id=holder.actor_id,
                incarnation=holder.incarnation,
                group_id=playing.group_id if playing is not None else "",
                slot=playing.slot if playing is not None else 0,
            )
            try:
                client.call(msg)
            except RemoteError as exc:
                if exc.reason == "lease_lost" and playing is not None and holder.playing is playing:
                    holder.lease_lost = playing
                    log.warning(
                        "%s: slot %s/%d is no longer ours (%s): dropping the episode",
                        holder.actor_id,
                        short_id(playing.group_id),
                        playing.slot,
                        exc,
                    )
                elif exc.reason != "lease_lost":  # lost after the episode was delivered: nothing to drop
                    log.warning("%s: lease renewal refused: %s", holder.actor_id, exc)
                    self._count("lease_renewal")
            except RequestTimeout as exc:
                log.warning("%s: lease renewal not answered (%s); the next round tries again", holder.actor_id, exc)
                self._count("lease_renewal")

    def _count(self, where: str) -> None:
        if self.on_error is not None:
            self.on_error(where)
