"""Replay buffer and rollout coordinator.

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
import random
import struct
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from common.metrics import ReplayBufferMetrics
from common.process import run_role
from common.server import serve_requests
from pipeline.config import PipelineConfig
from protocol import decode, encode
from protocol.codec import pack_frames, unpack_frames
from protocol.messages import (
    OFF_POLICY,
    ON_POLICY,
    ON_POLICY_TIPS,
    Ack,
    Assignment,
    AssignmentRequest,
    Batch,
    BatchRequest,
    ErrorReply,
    Ping,
    Pong,
    Trajectory,
    Wait,
)
from replay_buffer.config import ReplayBufferConfig

log = logging.getLogger("replay_buffer")


def draw_mode(rng: random.Random, p_memory: float, q_off_policy: float) -> str:
    """EMPO2's mode draw: tips with probability p; of those, off-policy update with probability q."""
    if rng.random() >= p_memory:
        return ON_POLICY
    return OFF_POLICY if rng.random() < q_off_policy else ON_POLICY_TIPS


@dataclass
class Group:
    group_id: str
    task: str
    variation: int
    mode: str
    size: int
    trajectories: dict[int, Trajectory] = field(default_factory=dict)  # slot -> trajectory
    leases: dict[int, float] = field(default_factory=dict)  # slot -> time handed out

    @property
    def complete(self) -> bool:
        return len(self.trajectories) == self.size

    @property
    def oldest_version(self) -> int:
        return min(int(t.policy_versions.min()) for t in self.trajectories.values())


class ReplayBuffer:
    """The buffer's logic: no sockets, no files (the log is replayed through add/mark_served)."""

    def __init__(self, cfg: ReplayBufferConfig, variations: dict[str, list[int]], seed: int = 0):
        self.cfg = cfg
        self.rng = random.Random(seed)
        self.targets = [(task, v) for task in cfg.tasks for v in variations[task][: cfg.variations_per_task]]
        if not self.targets:
            raise ValueError("replay_buffer.tasks gives no (task, variation) to train on")
        self._next_target = 0
        self.open: OrderedDict[str, Group] = OrderedDict()  # being played
        self.ready: OrderedDict[str, Group] = OrderedDict()  # complete, waiting for the learner
        self.served: set[str] = set()
        self.episode_ids: set[str] = set()

    def assign(self, now: float) -> tuple[Assignment | None, bool]:
        """Next slot to play, oldest group first; (None, False) when max_open_groups are all
        handed out or max_ready_groups wait for the learner (backpressure). The flag says the
        slot is a re-issue of an expired lease."""
        for group in self.open.values():
            for slot in range(group.size):
                if slot in group.trajectories:
                    continue
                leased = group.leases.get(slot)
                if leased is None or now - leased > self.cfg.assignment_timeout_s:
                    group.leases[slot] = now
                    return self._assignment(group, slot), leased is not None
        if len(self.open) >= self.cfg.max_open_groups or len(self.ready) >= self.cfg.max_ready_groups:
            return None, False
        task, variation = self.targets[self._next_target % len(self.targets)]
        self._next_target += 1
        mode = draw_mode(self.rng, self.cfg.p_memory, self.cfg.q_off_policy)
        group = Group(uuid.uuid4().hex, task, variation, mode, self.cfg.group_size)
        self.open[group.group_id] = group
        group.leases[0] = now
        return self._assignment(group, 0), False

    def _assignment(self, group: Group, slot: int) -> Assignment:
        return Assignment(group.group_id, slot, group.task, group.variation, group.mode, self.rng.randrange(2**31))

    def add(self, traj: Trajectory) -> bool:
        """Accept a trajectory; False if it is a duplicate (already held or its slot is filled)."""
        if (
            traj.episode_id in self.episode_ids
            or traj.group_id in self.served
            or not 0 <= traj.slot < self.cfg.group_size
        ):
            return False
        group = self.open.get(traj.group_id)
        if group is None:  # unknown group: a replayed log, or a buffer restarted mid-group
            group = Group(traj.group_id, traj.task, traj.variation, traj.mode, self.cfg.group_size)
            self.open[traj.group_id] = group
        if traj.slot in group.trajectories or traj.mode != group.mode:
            return False
        group.trajectories[traj.slot] = traj
        group.leases.pop(traj.slot, None)
        self.episode_ids.add(traj.episode_id)
        if group.complete:
            self.ready[group.group_id] = self.open.pop(group.group_id)
        return True

    def take_batch(self, learner_version: int, num_groups: int, max_staleness: int) -> tuple[list[Group], list[Group]]:
        """(groups to serve, groups dropped as stale). Serves only a full batch of num_groups."""
        stale = [g for g in self.ready.values() if learner_version - g.oldest_version > max_staleness]
        for g in stale:
            self.mark_served(g.group_id)
        if len(self.ready) < num_groups:
            return [], stale
        batch = list(self.ready.values())[:num_groups]
        for g in batch:
            self.mark_served(g.group_id)
        return batch, stale

    def mark_served(self, group_id: str) -> None:
        self.ready.pop(group_id, None)
        self.open.pop(group_id, None)
        self.served.add(group_id)


class BufferLog:
    """Append-only records: b'T' + encoded trajectory, or b'S' + served group id."""

    _HEADER = struct.Struct("<cQ")

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "ab")

    def append_trajectory(self, frames) -> None:
        self._append(b"T", pack_frames(frames))

    def append_served(self, group_id: str) -> None:
        self._append(b"S", group_id.encode())

    def _append(self, tag: bytes, payload: bytes) -> None:
        self.file.write(self._HEADER.pack(tag, len(payload)) + payload)
        self.file.flush()  # in the OS before the Ack: a crashed process loses nothing

    @classmethod
    def replay(cls, path: Path, buffer: ReplayBuffer) -> int:
        """Feed a previous run's records into `buffer`; returns the number of records read."""
        if not path.exists():
            return 0
        data, pos, count = path.read_bytes(), 0, 0
        while pos + cls._HEADER.size <= len(data):
            tag, size = cls._HEADER.unpack_from(data, pos)
            payload = data[pos + cls._HEADER.size : pos + cls._HEADER.size + size]
            if len(payload) < size:
                break
            pos += cls._HEADER.size + size
            count += 1
            if tag == b"T":
                buffer.add(decode(unpack_frames(payload)))
            elif tag == b"S":
                buffer.mark_served(payload.decode())
        if pos < len(data):  # a record torn by a crash mid-write: cut it so appends start clean
            log.warning("dropping a torn record of %d bytes at the end of %s", len(data) - pos, path)
            with open(path, "r+b") as f:
                f.truncate(pos)
        return count


class BufferProcess:
    def __init__(self, cfg: PipelineConfig, variations: dict[str, list[int]]):
        if cfg.replay_buffer.max_ready_groups < cfg.learner.groups_per_step:
            raise ValueError(
                f"replay_buffer.max_ready_groups ({cfg.replay_buffer.max_ready_groups}) < learner.groups_per_step "
                f"({cfg.learner.groups_per_step}): the learner would wait forever for a full batch"
            )
        self.cfg = cfg
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

    def run(self) -> None:
        log.info("replay buffer on %s; targets %s", self.cfg.endpoints.replay_buffer, self.buffer.targets)
        serve_requests(self.cfg.endpoints.replay_buffer, self.handle, self.metrics)

    def handle(self, msg):
        if isinstance(msg, Ping):
            return Pong(role="replay_buffer", policy_version=self.learner_version, ready=True)
        if isinstance(msg, AssignmentRequest):
            assignment, reissued = self.buffer.assign(time.time())
            if assignment is None:
                return Wait(retry_after_s=1.0, reason="all open groups handed out, or the learner is behind")
            self.metrics.assignments.labels(assignment.mode).inc()
            self.metrics.reassigned.inc(int(reissued))
            return assignment
        if isinstance(msg, Trajectory):
            if self.buffer.add(msg):
                self.log.append_trajectory(encode(msg))
                self.metrics.trajectories.labels(msg.mode).inc()
            else:
                self.metrics.duplicates.inc()
            self.metrics.groups_ready.set(len(self.buffer.ready))
            return Ack(ref=msg.episode_id)
        if isinstance(msg, BatchRequest):
            return self._batch(msg)
        self.metrics.rejected.labels("unexpected_kind").inc()
        return ErrorReply(reason="unexpected_kind", detail=f"{msg.KIND} is not served here")

    def _batch(self, req: BatchRequest):
        self.learner_version = req.learner_version
        self.metrics.policy_version.set(req.learner_version)
        groups, stale = self.buffer.take_batch(req.learner_version, req.num_groups, req.max_staleness)
        for g in stale + groups:
            self.log.append_served(g.group_id)
        self.metrics.groups_dropped_stale.inc(len(stale))
        self.metrics.groups_ready.set(len(self.buffer.ready))
        if not groups:
            return Wait(retry_after_s=self.cfg.learner.batch_poll_s, reason=f"{len(self.buffer.ready)} groups ready")
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


def main(argv: list[str] | None = None) -> None:
    run_role(
        argv,
        "replay_buffer",
        lambda cfg: BufferProcess(cfg, train_variations(cfg.replay_buffer.tasks, cfg.env_actor.simplification)),
    )


if __name__ == "__main__":
    main()
