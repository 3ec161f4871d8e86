"""Replay buffer and rollout coordinator: the process around the buffer's logic (replay_buffer/buffer.py).

It hands out rollout slots in GRPO groups (G rollouts of one (task, variation), one mode per
group, drawn with EMPO2's p and q), collects the finished trajectories, and serves the learner
batches of complete groups, dropping groups that are too stale for the learner's version.

Durability: every accepted trajectory is appended to a log (the protocol's own encoding) before
it is acknowledged, and every group served to the learner is recorded there too. A restarted
buffer replays the log: nothing acknowledged is lost, nothing served is served twice.

Socket: ROUTER bound at endpoints.replay_buffer.
  in : Ping, AssignmentRequest (actors), Trajectory (actors), BatchRequest (learner)
  out: Pong, Assignment | Wait, Ack, Batch | Wait, ErrorReply

Run: `empo2-replay-buffer [key=value ...]`.
"""

from __future__ import annotations

import hmac
import logging
import time

from common.metrics import ReplayBufferMetrics
from common.model_prep import model_vocab_size
from common.process import run_role
from common.server import serve_requests
from pipeline.cli import role_config
from pipeline.config import PipelineConfig, door_limits
from protocol import ProtocolError, encode
from protocol.messages import Ack, Assignment, AssignmentRequest, Batch, BatchRequest, Ping, Pong, Trajectory, Wait
from replay_buffer.buffer import BufferLog, ReplayBuffer

log = logging.getLogger("replay_buffer")

# An actor told to wait (every open group handed out, or the learner behind) asks again after this.
ASSIGNMENT_RETRY_S = 1.0


class BufferProcess:
    def __init__(self, cfg: PipelineConfig, variations: dict[str, list[int]], vocab_size: int = 0):
        self.cfg = cfg  # validated at load: e.g. max_ready_groups >= learner.groups_per_step
        self.limits = door_limits(cfg, vocab_size)  # every message is checked against these (common/server.py)
        self.buffer = ReplayBuffer(cfg.replay_buffer, variations, cfg.seed)
        self.metrics = ReplayBufferMetrics()
        log_path = cfg.run_path(cfg.replay_buffer.log_file)
        replayed = BufferLog.replay(log_path, self.buffer)
        if replayed:
            log.info(
                "replayed %d records from %s: %d groups ready, %d open",
                replayed,
                log_path,
                len(self.buffer.ready),
                len(self.buffer.open),
            )
        self.log = BufferLog(log_path)
        self.learner_version = 0
        # The newest policy version known to exist: the learner's last BatchRequest, or at start the
        # newest version in the log. A trajectory's versions may be at most one ahead of it (the
        # learner pushes version v+1 before it asks for its next batch with v+1).
        held = [t for g in [*self.buffer.open.values(), *self.buffer.ready.values()] for t in g.trajectories.values()]
        self.newest_version = max((int(t.policy_versions.max()) for t in held), default=0)
        self.learner_seen = False  # a BatchRequest came from the learner since this process started
        self.handlers = {  # what this server answers (common/server.py: anything else is an unexpected kind)
            Ping: self.ping,
            AssignmentRequest: self.assign,
            Trajectory: self.add_trajectory,
            BatchRequest: self.batch,
        }

    def run(self) -> None:
        log.info("replay buffer on %s; targets %s", self.cfg.endpoints.replay_buffer, self.buffer.targets)
        serve_requests(self.cfg.endpoints.replay_buffer, self.handlers, self.metrics, self.limits)

    def ping(self, msg: Ping) -> Pong:
        return Pong(role="replay_buffer", policy_version=self.learner_version, ready=True)

    def assign(self, msg: AssignmentRequest) -> Assignment | Wait:
        if self.buffer.held_bytes() >= self.cfg.security.max_held_trajectory_bytes:
            return Wait(retry_after_s=ASSIGNMENT_RETRY_S, reason="the buffer holds its byte limit of trajectories")
        assignment, reissued = self.buffer.assign(time.time())
        if assignment is None:
            return Wait(retry_after_s=ASSIGNMENT_RETRY_S, reason="all open groups handed out, or the learner is behind")
        self.metrics.assignments.labels(assignment.mode).inc()
        self.metrics.reassigned.inc(int(reissued))
        return assignment

    def add_trajectory(self, msg: Trajectory) -> Ack:
        """Persisted before the Ack. A duplicate (a re-sent upload) is answered Ack(duplicate=True) and
        counted; anything else not stored raises ProtocolError: ErrorReply(reason) (common/server.py)."""
        if self.buffer.is_duplicate(msg):
            self.metrics.duplicates.inc()
            return Ack(ref=msg.episode_id, detail="already stored", duplicate=True)
        newest = int(msg.policy_versions.max())
        if newest > self.newest_version + 1:
            raise ProtocolError("version_ahead", f"policy version {newest} > newest known {self.newest_version} + 1")
        self.buffer.check_lease(msg)
        if self.buffer.add(msg):
            self.log.append_trajectory(encode(msg))
            self.metrics.trajectories.labels(msg.mode).inc()
            self.metrics.trajectories_success.labels(msg.mode).inc(int(msg.success))
        else:
            self.metrics.duplicates.inc()
        self.metrics.groups_ready.set(len(self.buffer.ready))
        return Ack(ref=msg.episode_id)

    def check_learner(self, req: BatchRequest) -> None:
        """Only the learner takes batches (issue 14): its token (security.learner_token, when set; CURVE
        limits who may connect at all), and a version it can have: at most learner.total_steps, and
        once the learner has asked, at most one above its previous request (one step per batch)."""
        token = self.cfg.security.learner_token
        if token and not hmac.compare_digest(req.token.encode(), token.encode()):
            raise ProtocolError("not_learner", "batch requests need the learner's token (security.learner_token)")
        limit = self.cfg.learner.total_steps
        if self.learner_seen:
            limit = min(limit, self.learner_version + 1)
        if req.learner_version > limit:
            raise ProtocolError("version_ahead", f"learner_version {req.learner_version} > {limit}")

    def batch(self, req: BatchRequest) -> Batch | Wait:
        self.check_learner(req)
        self.learner_seen = True
        self.newest_version = max(self.newest_version, req.learner_version)
        self.learner_version = req.learner_version
        self.metrics.policy_version.set(req.learner_version)
        groups, stale = self.buffer.take_batch(req.learner_version, req.num_groups, req.max_staleness)
        for g in stale + groups:
            self.log.append_served(g.group_id)
        self.metrics.groups_dropped_stale.inc(len(stale))
        self.metrics.groups_ready.set(len(self.buffer.ready))
        if not groups:
            return Wait(
                retry_after_s=self.cfg.replay_buffer.batch_poll_s, reason=f"{len(self.buffer.ready)} groups ready"
            )
        self.metrics.groups_served.inc(len(groups))
        trajectories = [t for g in groups for _, t in sorted(g.trajectories.items())]
        for t in trajectories:
            for v in t.policy_versions.tolist():
                self.metrics.staleness.observe(req.learner_version - v)
        return Batch(trajectories=trajectories, dropped_stale=len(stale))


def train_variations(tasks: list[str], simplification: str) -> dict[str, list[int]]:
    """Each task's train variation ids, read from ScienceWorld once at start-up."""
    from common.scienceworld import ScienceWorld

    env = ScienceWorld(simplification)
    try:
        return {task: env.train_variations(task) for task in tasks}
    finally:
        env.close()


def main(argv: list[str] | None = None, cfg: PipelineConfig | None = None) -> None:
    run_role(
        cfg or role_config("empo2-replay-buffer", argv),
        "replay_buffer",
        lambda cfg: BufferProcess(
            cfg,
            train_variations(cfg.replay_buffer.tasks, cfg.env.simplification),
            model_vocab_size(cfg.model.name, cfg.model.cache_dir or None),
        ),
    )


if __name__ == "__main__":
    main()
