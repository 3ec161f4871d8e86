"""The replay buffer's logic, without sockets: GRPO groups handed out slot by slot, the finished
trajectories collected, complete groups served as batches (stale ones dropped), and the
append-only log a restarted buffer replays. Plain objects: tests drive them directly; the
process wrapper (replay_buffer/service.py) owns the socket and the metrics.
"""

from __future__ import annotations

import logging
import random
import struct
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from protocol import decode
from protocol.codec import pack_frames, unpack_frames
from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS, Assignment, Trajectory
from replay_buffer.config import ReplayBufferConfig

log = logging.getLogger("replay_buffer")

# An assignment's seed is drawn from [0, SEED_RANGE): any non-negative 32-bit seed.
SEED_RANGE = 2**31


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

    def __init__(
        self, cfg: ReplayBufferConfig, variations: dict[str, list[int]], seed: int, sync_groups: int = 0
    ):  # seed: the run's
        """sync_groups > 0: the synchronous baseline (pipeline.mode=sync, sync_groups = the learner's
        groups_per_step): one batch of groups per policy version (a round), the next round opened by
        the learner's request for a batch at the next version (start_round), so no episode is played
        while the learner steps and pushes, and every turn is played by the version that learns from it."""
        self.cfg = cfg
        self.sync_groups = sync_groups
        self.round_version = 0  # sync: the policy version whose round is being played
        self.round_groups = 0  # sync: groups created in this round
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
        if self.sync_groups and self.round_groups >= self.sync_groups:  # this version's batch is handed out
            return None, False
        self.round_groups += 1
        task, variation = self.targets[self._next_target % len(self.targets)]
        self._next_target += 1
        mode = draw_mode(self.rng, self.cfg.p_memory, self.cfg.q_off_policy)
        group = Group(uuid.uuid4().hex, task, variation, mode, self.cfg.group_size)
        self.open[group.group_id] = group
        group.leases[0] = now
        return self._assignment(group, 0), False

    def _assignment(self, group: Group, slot: int) -> Assignment:
        return Assignment(group.group_id, slot, group.task, group.variation, group.mode, self.rng.randrange(SEED_RANGE))

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

    def start_round(self, learner_version: int) -> None:
        """sync: the learner asks for a batch at `learner_version`; past the round's version (its step
        and push are done: the servers serve it), the next round's groups may be handed out."""
        if self.sync_groups and learner_version > self.round_version:
            self.round_version, self.round_groups = learner_version, 0

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
