"""Replay buffer and rollout coordinator: the process around the buffer's logic (replay_buffer/buffer.py).

It hands out rollout slots in GRPO groups (G rollouts of one (task, variation), one mode per
group, drawn with EMPO2's p and q), collects the finished trajectories, and serves the learner
batches of complete groups, dropping groups that are too stale for the learner's version.

Durability: every accepted trajectory is appended to a log of checksummed records (the
protocol's own encoding) before it is acknowledged (replay_buffer.durability: in the OS, fsync'd,
or group-committed), and every group the learner confirms (or that is dropped as stale) is
recorded there too. A restarted buffer replays the log: nothing acknowledged is lost, nothing
confirmed is served twice, and a corrupt record costs that record only. A batch is served in
parts that fit the learner's message limit and stays the buffer's until the learner confirms it
(re-served after batch_confirm_timeout_s, or at once when the learner asks anew: it restarted).

Socket: ROUTER bound at endpoints.replay_buffer.
  in : Ping, AssignmentRequest, AssignmentReturn, LeaseRenewal, Trajectory (actors), BatchRequest, BatchConfirm
       (learner)
  out: Pong, Assignment | Wait, Ack, Ack | ErrorReply(lease_lost), Ack, Batch | Wait, Ack, ErrorReply

Leases: a slot is its actor's while the actor renews it (LeaseRenewal, from a thread of the actor's
own); one not renewed for replay_buffer.lease_ttl_s is handed out again (counted), and a restarted
actor (a new incarnation) releases its predecessor's at once.

Run: `empo2-replay-buffer [key=value ...]`.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import time
from dataclasses import replace

from common.config import EnvConfig, HerlConfig, RunFacts, SgeConfig
from common.metrics import ReplayBufferMetrics
from common.model_prep import model_vocab_size
from common.process import run_role
from common.server import AfterCommit, serve_requests
from protocol import ProtocolError, encode
from protocol.codec import DEFAULT_MAX_MESSAGE_BYTES
from protocol.messages import (
    Ack,
    Assignment,
    AssignmentRequest,
    AssignmentReturn,
    Batch,
    BatchConfirm,
    BatchRequest,
    ErrorReply,
    LeaseRenewal,
    Ping,
    Pong,
    Trajectory,
    Wait,
)
from protocol.transport import process_uptime_s
from replay_buffer.buffer import BatchInFlight, BufferLog, ReplayBuffer
from replay_buffer.config import Durability, ReplayBufferConfig

log = logging.getLogger("replay_buffer")

# An actor told to wait (every open group handed out, or the learner behind) asks again after this.
ASSIGNMENT_RETRY_S = 1.0
# Secure by default (issue 26): a buffer that cannot tell the learner from any other client serves
# batches to no one: every BatchRequest is refused (REFUSED_UNCHECKED, within the protocol's detail
# bound), and the start-up log says once how to configure a check (NO_LEARNER_CHECK).
REFUSED_UNCHECKED = "neither security.curve nor security.learner_token is set on the buffer: no batches (see its log)"
NO_LEARNER_CHECK = (
    "this replay buffer has neither security.curve nor security.learner_token, so it serves batches to no one: "
    "give the buffer and the learner the same security.learner_token (or EMPO2_LEARNER_TOKEN in their "
    "environment; empo2-run and deploy/systemd/install.sh make one), or set security.curve=true, or "
    "security.insecure=true to serve any client that reaches it"
)


class BufferProcess:
    def __init__(
        self,
        replay_buffer: ReplayBufferConfig,
        run: RunFacts,
        variations: dict[str, list[int]],
        vocab_size: int = 0,
        herl: HerlConfig | None = None,
        sge: SgeConfig | None = None,
    ):
        # validated at load: e.g. max_ready_groups >= learner.groups_per_step
        self.bcfg, self.run_facts = replay_buffer, run
        # every message is checked against these (common/server.py)
        self.limits = replace(run.door, vocab_size=vocab_size)
        sync_groups = run.groups_per_step if run.sync else 0  # pipeline.mode=sync: one batch per policy version
        self.buffer = ReplayBuffer(replay_buffer, variations, run.seed, sync_groups, herl, sge)
        self.metrics = ReplayBufferMetrics()
        log_path = run.run_path(replay_buffer.log_file)
        self.report_replay(log_path, BufferLog.replay(log_path, self.buffer))
        self.log = BufferLog(log_path, replay_buffer.durability)
        self.learner_version = 0
        # The newest policy version known to exist: the learner's last BatchRequest, or at start the
        # newest version in the log. A trajectory's versions may be at most one ahead of it (the
        # learner pushes version v+1 before it asks for its next batch with v+1).
        held = [t for g in [*self.buffer.open.values(), *self.buffer.ready.values()] for t in g.trajectories.values()]
        self.newest_version = max((int(t.policy_versions.max()) for t in held), default=0)
        self.learner_seen = False  # a BatchRequest came from the learner since this process started
        security = run.security
        # neither CURVE (only the learner's key may send a BatchRequest) nor a token, nor told to serve anyone
        self.batches_closed = not (security.curve or security.learner_token or security.insecure)
        if self.batches_closed:  # said once, at start-up; each refusal then names its reason
            log.warning(NO_LEARNER_CHECK)
        elif not (security.curve or security.learner_token):
            log.warning(
                "security.insecure=true: any client that reaches %s may take batches", run.endpoints.replay_buffer
            )
        self.handlers = {  # what this server answers (common/server.py: anything else is an unexpected kind)
            Ping: self.ping,
            AssignmentRequest: self.assign,
            AssignmentReturn: self.return_assignment,
            LeaseRenewal: self.renew,
            Trajectory: self.add_trajectory,
            BatchRequest: self.batch,
            BatchConfirm: self.confirm,
        }

    def report_replay(self, log_path, replayed) -> None:
        """The replay's outcome in the log and the metrics: what was read, what was skipped and why."""
        self.metrics.log_records_replayed.set(replayed.records)
        for fault, count in replayed.skipped.items():
            self.metrics.log_records_skipped.labels(fault).inc(count)
        if replayed.records:
            log.info(
                "replayed %d records from %s: %d groups ready, %d open",
                replayed.records,
                log_path,
                len(self.buffer.ready),
                len(self.buffer.open),
            )
        if replayed.skipped:
            log.warning(
                "%s: skipped %d corrupt records (%s; %d bytes left in place) and kept every intact record; "
                "cut a torn tail of %d bytes",
                log_path,
                sum(replayed.skipped.values()),
                ", ".join(f"{fault} {n}" for fault, n in sorted(replayed.skipped.items())),
                replayed.skipped_bytes,
                replayed.truncated_bytes,
            )

    def run(self) -> None:
        log.info(
            "replay buffer on %s; targets %s; log durability %s",
            self.run_facts.endpoints.replay_buffer,
            self.buffer.targets,
            self.bcfg.durability,
        )
        try:
            serve_requests(
                self.run_facts.endpoints.bind_address(self.run_facts.endpoints.replay_buffer),
                self.handlers,
                self.metrics,
                self.limits,
                commit=self.commit,
                commit_interval_s=self.bcfg.group_commit_ms / 1000,
            )
        finally:
            self.log.close()

    def commit(self) -> None:
        """Group commit: one fsync for every record whose Ack is held (common/server.py, AfterCommit)."""
        t0 = time.perf_counter()
        self.log.sync()
        self.metrics.log_fsync_seconds.observe(time.perf_counter() - t0)

    def durable(self, reply):
        """`reply` as it may go out under replay_buffer.durability: at once (flush; fsync has
        synced in the append), or after the next group commit."""
        if self.bcfg.durability == Durability.group and self.log.unsynced:
            return AfterCommit(reply)
        return reply

    def ping(self, msg: Ping) -> Pong:
        return Pong(role="replay_buffer", policy_version=self.learner_version, ready=True, uptime_s=process_uptime_s())

    def assign(self, msg: AssignmentRequest) -> Assignment | Wait:
        if self.buffer.held_bytes() >= self.run_facts.security.max_held_trajectory_bytes:
            return Wait(retry_after_s=ASSIGNMENT_RETRY_S, reason="the buffer holds its byte limit of trajectories")
        assignment, reissued = self.buffer.assign(time.time(), msg.actor_id, msg.incarnation)
        self.observe_groups()  # a guided group past its wait closes here
        if assignment is None:
            return Wait(retry_after_s=ASSIGNMENT_RETRY_S, reason="all open groups handed out, or the learner is behind")
        self.metrics.assignments.labels(assignment.mode).inc()
        self.metrics.reassigned.inc(int(reissued))
        return assignment

    def observe_groups(self) -> None:
        self.metrics.groups_ready.set(len(self.buffer.ready))
        self.metrics.groups_open.set(len(self.buffer.open))
        for name, value in dataclasses.asdict(self.buffer.hindsight).items():
            self.metrics.hindsight.labels(name).set(value)
        for name, value in dataclasses.asdict(self.buffer.leases).items():
            self.metrics.leases.labels(name).set(value)
        self.metrics.open_slots.clear()  # only the holders of live leases are labels
        for holder, slots in self.buffer.waiting_on().items():
            self.metrics.open_slots.labels(holder or "none").set(slots)
        self.metrics.lease_renewed_at.clear()
        for holder, renewed in self.buffer.oldest_renewals().items():
            self.metrics.lease_renewed_at.labels(holder or "none").set(renewed)

    def renew(self, msg: LeaseRenewal) -> Ack:
        """An actor's keep-alive for the slot it plays: Ack while the slot is its own; a slot that is no
        longer its (lapsed and handed out again, filled by another episode, its group gone) is refused
        lease_lost (counted), and the actor drops the episode."""
        renewed = self.buffer.renew(msg.group_id, msg.slot, msg.actor_id, msg.incarnation, time.time())
        self.observe_groups()
        if not renewed:
            raise ProtocolError(
                "lease_lost", f"{msg.group_id[:64]}/{msg.slot} is no longer leased to {msg.actor_id[:64]}"
            )
        return Ack(ref=f"{msg.group_id}/{msg.slot}", detail="renewed" if msg.group_id else "no slot")

    def return_assignment(self, msg: AssignmentReturn) -> Ack:
        """A stopping actor's unfinished slot: handed out again at the next request (unless another
        actor holds it now)."""
        released = self.buffer.release(msg.group_id, msg.slot, msg.actor_id, msg.incarnation)
        self.observe_groups()
        self.metrics.assignments_returned.inc(int(released))
        log.info("%s returned %s/%d%s", msg.actor_id, msg.group_id[:8], msg.slot, "" if released else " (no lease)")
        return Ack(ref=f"{msg.group_id}/{msg.slot}", detail="released" if released else "no lease")

    def add_trajectory(self, msg: Trajectory) -> Ack | ErrorReply | AfterCommit:
        """Persisted before the Ack. A duplicate (a re-sent upload) is answered Ack(duplicate=True) and
        counted; one too large to fit any Batch the learner accepts is refused (too_large); anything
        else not stored raises ProtocolError: ErrorReply(reason) (common/server.py)."""
        if self.buffer.is_duplicate(msg):
            self.metrics.duplicates.inc()
            return Ack(ref=msg.episode_id, detail="already stored", duplicate=True)
        frames = encode(msg)
        nbytes = sum(len(memoryview(f)) for f in frames)
        limit = self.bcfg.max_trajectory_bytes
        if nbytes > limit:
            self.metrics.rejected.labels("too_large").inc()
            return ErrorReply(
                reason="too_large",
                detail=f"trajectory of {nbytes} bytes is over replay_buffer.max_trajectory_bytes ({limit})",
            )
        newest = int(msg.policy_versions.max())
        if newest > self.newest_version + 1:
            raise ProtocolError("version_ahead", f"policy version {newest} > newest known {self.newest_version} + 1")
        self.buffer.check_lease(msg)
        if self.buffer.add(msg, nbytes):
            self.log.append_trajectory(frames)
            self.metrics.trajectories.labels(msg.mode).inc()
            self.metrics.trajectories_success.labels(msg.mode).inc(int(msg.success))
        else:
            self.metrics.duplicates.inc()
        self.observe_groups()
        return self.durable(Ack(ref=msg.episode_id))

    def check_learner(self, req: BatchRequest) -> None:
        """Only the learner takes batches (issue 14): its token (security.learner_token, when set; under
        CURVE only the learner's key may send a BatchRequest: common/server.py), none at all when neither
        is configured unless security.insecure (issue 26), and a version it can have: at most
        learner.total_steps, and once the learner has asked, at most one above its previous request
        (one step per batch)."""
        if self.batches_closed:
            raise ProtocolError("no_learner_auth", REFUSED_UNCHECKED)
        token = self.run_facts.security.learner_token
        if token and not hmac.compare_digest(req.token.encode(), token.encode()):
            raise ProtocolError("not_learner", "batch requests need the learner's token (security.learner_token)")
        limit = self.run_facts.total_steps
        if self.learner_seen:
            limit = min(limit, self.learner_version + 1)
        if req.learner_version > limit:
            raise ProtocolError("version_ahead", f"learner_version {req.learner_version} > {limit}")

    def batch(self, req: BatchRequest) -> Batch | Wait | ErrorReply:
        """A part of the batch in flight (req.batch_id), or a new batch: the learner's first ask
        after a restart also gives back every batch it never confirmed."""
        self.check_learner(req)
        now = time.time()
        if req.batch_id:
            in_flight = self.buffer.in_flight.get(req.batch_id)
            if in_flight is None or req.part >= len(in_flight.parts):
                return ErrorReply(
                    reason="unknown_batch", detail=f"no part {req.part} of batch {req.batch_id} in flight"
                )
            return self._part(in_flight, req.part, 0)
        self.metrics.groups_requeued.inc(self.buffer.requeue_unconfirmed(now, all_batches=True))
        self.learner_seen = True
        self.newest_version = max(self.newest_version, req.learner_version)
        self.learner_version = req.learner_version
        self.metrics.policy_version.set(req.learner_version)
        self.buffer.start_round(req.learner_version)  # sync mode: the learner's step and push are done
        max_bytes = req.max_bytes or DEFAULT_MAX_MESSAGE_BYTES
        try:
            batch, stale = self.buffer.take_batch(
                req.learner_version, req.num_groups, req.max_staleness, max_bytes, now
            )
        except ValueError as exc:  # a trajectory over the learner's limit (a learner with a smaller one)
            self.metrics.rejected.labels("too_large").inc()
            return ErrorReply(reason="too_large", detail=str(exc))
        for g in stale:
            self.log.append_served(g.group_id)
        self.metrics.groups_dropped_stale.inc(len(stale))
        self.metrics.groups_ready.set(len(self.buffer.ready))
        if batch is None:
            return self.durable(
                Wait(retry_after_s=self.bcfg.batch_poll_s, reason=f"{len(self.buffer.ready)} groups ready")
            )
        self.metrics.groups_served.inc(len(batch.groups))
        for t in (t for part in batch.parts for t in part):
            for v in t.policy_versions.tolist():
                self.metrics.staleness.observe(req.learner_version - v)
        return self.durable(self._part(batch, 0, len(stale)))

    def _part(self, batch: BatchInFlight, part: int, dropped_stale: int) -> Batch:
        self.metrics.batch_parts.inc()
        return Batch(
            trajectories=batch.parts[part],
            dropped_stale=dropped_stale,
            batch_id=batch.batch_id,
            part=part,
            num_parts=len(batch.parts),
        )

    def confirm(self, msg: BatchConfirm) -> Ack | AfterCommit:
        """The learner used the batch: its groups are served for good, on record before the Ack.
        Other batches past their confirm timeout go back to the ready groups here (and all of them
        at a request for a new batch)."""
        group_ids = self.buffer.confirm(msg.batch_id)
        self.metrics.groups_requeued.inc(self.buffer.requeue_unconfirmed(time.time()))
        if group_ids is None:
            self.metrics.confirms_unknown.inc()
            return Ack(ref=msg.batch_id, detail="not in flight: confirmed before, or re-served since")
        for group_id in group_ids:
            self.log.append_served(group_id)
        self.metrics.groups_confirmed.inc(len(group_ids))
        return self.durable(Ack(ref=msg.batch_id, detail=f"{len(group_ids)} groups confirmed"))


def train_variations(tasks: list[str], simplification: str) -> dict[str, list[int]]:
    """Each task's train variation ids, read from ScienceWorld once at start-up."""
    from common.scienceworld import ScienceWorld

    env = ScienceWorld(simplification)
    try:
        return {task: env.train_variations(task) for task in tasks}
    finally:
        env.close()


def main(replay_buffer: ReplayBufferConfig, env: EnvConfig, herl: HerlConfig, sge: SgeConfig, run: RunFacts) -> None:
    model = run.model
    run_role(
        "replay_buffer",
        run,
        lambda: BufferProcess(
            replay_buffer,
            run,
            train_variations(replay_buffer.tasks, env.simplification),
            model_vocab_size(model.name, model.cache_dir or None),
            herl,
            sge,
        ),
    )
