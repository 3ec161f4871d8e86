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

import logging
import time

from common.metrics import ReplayBufferMetrics
from common.process import run_role
from common.server import serve_requests
from pipeline.cli import role_config
from pipeline.config import PipelineConfig
from protocol import encode
from protocol.messages import Ack, Assignment, AssignmentRequest, Batch, BatchRequest, Ping, Pong, Trajectory, Wait
from replay_buffer.buffer import BufferLog, ReplayBuffer

log = logging.getLogger("replay_buffer")

# An actor told to wait (every open group handed out, or the learner behind) asks again after this.
ASSIGNMENT_RETRY_S = 1.0


class BufferProcess:
    def __init__(self, cfg: PipelineConfig, variations: dict[str, list[int]]):
        self.cfg = cfg  # validated at load: e.g. max_ready_groups >= learner.groups_per_step
        sync_groups = cfg.learner.groups_per_step if cfg.pipeline.mode == "sync" else 0  # pipeline.mode
        self.buffer = ReplayBuffer(cfg.replay_buffer, variations, cfg.seed, sync_groups)
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
        self.handlers = {  # what this server answers (common/server.py: anything else is an unexpected kind)
            Ping: self.ping,
            AssignmentRequest: self.assign,
            Trajectory: self.add_trajectory,
            BatchRequest: self.batch,
        }

    def run(self) -> None:
        log.info("replay buffer on %s; targets %s", self.cfg.endpoints.replay_buffer, self.buffer.targets)
        serve_requests(self.cfg.endpoints.replay_buffer, self.handlers, self.metrics)

    def ping(self, msg: Ping) -> Pong:
        return Pong(role="replay_buffer", policy_version=self.learner_version, ready=True)

    def assign(self, msg: AssignmentRequest) -> Assignment | Wait:
        assignment, reissued = self.buffer.assign(time.time())
        if assignment is None:
            return Wait(retry_after_s=ASSIGNMENT_RETRY_S, reason="all open groups handed out, or the learner is behind")
        self.metrics.assignments.labels(assignment.mode).inc()
        self.metrics.reassigned.inc(int(reissued))
        return assignment

    def add_trajectory(self, msg: Trajectory) -> Ack:
        """Persisted before the Ack; a duplicate (a re-sent upload) is acknowledged and counted."""
        if self.buffer.add(msg):
            self.log.append_trajectory(encode(msg))
            self.metrics.trajectories.labels(msg.mode).inc()
            self.metrics.trajectories_success.labels(msg.mode).inc(int(msg.success))
        else:
            self.metrics.duplicates.inc()
        self.metrics.groups_ready.set(len(self.buffer.ready))
        return Ack(ref=msg.episode_id)

    def batch(self, req: BatchRequest) -> Batch | Wait:
        self.learner_version = req.learner_version
        self.metrics.policy_version.set(req.learner_version)
        self.buffer.start_round(req.learner_version)  # sync mode: the learner's step and push are done
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
        lambda cfg: BufferProcess(cfg, train_variations(cfg.replay_buffer.tasks, cfg.env.simplification)),
    )


if __name__ == "__main__":
    main()
