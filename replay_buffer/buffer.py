"""The replay buffer's logic, without sockets: GRPO groups handed out slot by slot, the finished
trajectories collected, complete groups served as batches (stale ones dropped), and the
append-only log a restarted buffer replays. Plain objects: tests drive them directly; the
process wrapper (replay_buffer/service.py) owns the socket and the metrics.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

from common.config import HerlConfig, SgeConfig
from protocol import ProtocolError, decode
from protocol.codec import pack_frames, unpack_frames
from protocol.messages import (
    BATCH_ENVELOPE_BYTES,
    GUIDED,
    OFF_POLICY,
    ON_POLICY,
    ON_POLICY_TIPS,
    Assignment,
    Trajectory,
)
from protocol.records import RECORD_MAGIC, Scan, frame_record, scan
from replay_buffer.config import Durability, ReplayBufferConfig
from replay_buffer.hindsight import guidance_text, hindsight_candidates, insertion

log = logging.getLogger("replay_buffer")

# An assignment's seed is drawn from [0, SEED_RANGE): any non-negative 32-bit seed.
SEED_RANGE = 2**31


def draw_mode(rng: random.Random, p_memory: float, q_off_policy: float) -> str:
    """EMPO2's mode draw: tips with probability p; of those, off-policy update with probability q."""
    if rng.random() >= p_memory:
        return ON_POLICY
    return OFF_POLICY if rng.random() < q_off_policy else ON_POLICY_TIPS


@dataclass
class Lease:
    """A slot handed out: to whom (the actor id and its process's incarnation, "" when not said), when,
    and when its actor last renewed it (LeaseRenewal). It lapses lease_ttl_s after the last renewal,
    or assignment_timeout_s after it was granted however often it was renewed; a lapsed lease stays
    its holder's until another actor asks for a slot (assign hands it out again)."""

    actor_id: str
    incarnation: str
    granted: float
    renewed: float

    def lapsed(self, now: float, cfg: ReplayBufferConfig) -> bool:
        return now - self.renewed > cfg.lease_ttl_s or now - self.granted > cfg.assignment_timeout_s

    def held_by(self, actor_id: str, incarnation: str) -> bool:
        return self.actor_id == actor_id and self.incarnation == incarnation


@dataclass
class LeaseCounts:
    """Lease events since start (the service exports them): leases renewed, renewals of a slot no
    longer the sender's (lost), leases that lapsed and were handed out again, leases released at once
    because their actor restarted (a new incarnation) or returned them."""

    renewed: int = 0
    lost: int = 0
    lapsed: int = 0
    released_restart: int = 0
    released_return: int = 0


# The incarnations of restarted actors kept to recognise a late message of a dead process (its
# predecessor's id must not take the actor back from its successor): the newest this many. And the
# actors whose incarnation is known: the last this many to say a new one (ids come from clients).
RETIRED_INCARNATIONS = 4096
KNOWN_ACTORS = 65536


@dataclass
class Group:
    group_id: str
    task: str
    variation: int
    mode: str
    size: int
    trajectories: dict[int, Trajectory] = field(default_factory=dict)  # slot -> trajectory
    leases: dict[int, Lease] = field(default_factory=dict)  # slot -> its lease (unfilled slots only)
    sizes: dict[int, int] = field(default_factory=dict)  # slot -> encoded bytes of its trajectory
    # Rebuilt from the log after a restart: its leases were not logged, so a free slot of it is
    # accepted without one (the group id itself was handed out by this buffer before the restart).
    from_log: bool = False
    # HeRL (replay_buffer/hindsight.py): once complete and unsolved, the guided slots (size, size+1, ...)
    # each replaying one tied-best member (guided slot -> that member's slot) with its guidance
    guided: dict[int, int] = field(default_factory=dict)
    guidance: dict[int, str] = field(default_factory=dict)  # guided slot -> its guidance text
    revisions: dict[int, Trajectory] = field(default_factory=dict)  # guided slot -> the guided episode
    guided_since: float = 0.0  # when its guided slots were opened

    @property
    def complete(self) -> bool:
        return len(self.trajectories) == self.size

    def free_slots(self) -> list[int]:
        """Slots still to play: the members', then the guided ones."""
        members = [s for s in range(self.size) if s not in self.trajectories]
        return members + [s for s in self.guided if s not in self.revisions]

    @property
    def oldest_version(self) -> int:
        return min(int(t.policy_versions.min()) for t in self.trajectories.values())


class ReplayBuffer:
    """The buffer's logic: no sockets, no files (the log is replayed through add/mark_served)."""

    def __init__(
        self,
        cfg: ReplayBufferConfig,
        variations: dict[str, list[int]],
        seed: int,
        sync_groups: int = 0,
        herl: HerlConfig | None = None,
        sge: SgeConfig | None = None,
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
        self.in_flight: dict[str, BatchInFlight] = {}  # batch id -> served, not yet confirmed
        self.served: set[str] = set()  # groups confirmed by the learner (or dropped as stale)
        self.episode_ids: set[str] = set()
        self.herl = herl if herl is not None and herl.enabled else None
        self.hindsight = HindsightCounts()
        self.sge = sge if sge is not None and sge.enabled else None
        self.leases = LeaseCounts()
        self.incarnations: OrderedDict[str, str] = OrderedDict()  # actor id -> its newest incarnation seen
        self.retired: OrderedDict[str, None] = OrderedDict()  # incarnations replaced by a newer one

    def assign(self, now: float, actor_id: str = "", incarnation: str = "") -> tuple[Assignment | None, bool]:
        """Next slot to play, oldest group first, leased to `actor_id` (`incarnation`: its process's);
        (None, False) when max_open_groups are all handed out or max_ready_groups wait for the learner
        (backpressure). The flag says the slot is a re-issue of a lapsed lease (counted)."""
        self.see_incarnation(actor_id, incarnation)
        self.expire_guidance(now)
        for group in self.open.values():
            for slot in group.free_slots():
                leased = group.leases.get(slot)
                if leased is None or leased.lapsed(now, self.cfg):
                    group.leases[slot] = Lease(actor_id, incarnation, now, now)
                    if leased is not None:
                        self.leases.lapsed += 1
                        log.info(
                            "lease of %s/%d lapsed (%s, last renewed %.0fs ago): handed out again to %s",
                            group.group_id[:8],
                            slot,
                            leased.actor_id or "an actor",
                            now - leased.renewed,
                            actor_id or "an actor",
                        )
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
        group.leases[0] = Lease(actor_id, incarnation, now, now)
        return self._assignment(group, 0), False

    def release(self, group_id: str, slot: int, actor_id: str = "", incarnation: str = "") -> bool:
        """Give a leased, unfinished slot back (its actor stopped): the next assign hands it out
        again. False if there was no such lease (the slot is filled, or the group is gone), or it is
        another actor's now (it lapsed and was handed out again). An `actor_id` of "" releases any
        holder's lease."""
        self.see_incarnation(actor_id, incarnation)
        group = self.open.get(group_id)
        lease = None if group is None or slot in group.trajectories else group.leases.get(slot)
        if lease is None or actor_id and lease.actor_id != actor_id:
            return False
        del group.leases[slot]
        self.leases.released_return += 1
        return True

    def renew(self, group_id: str, slot: int, actor_id: str, incarnation: str, now: float) -> bool:
        """An actor's keep-alive for the slot it plays (LeaseRenewal): True if the lease is still its
        own (renewed until now + lease_ttl_s; a lapsed one not yet handed out again is its own still),
        False if the slot is no longer its: handed out again, filled, its group closed or unknown. A
        group rebuilt from the log after a restart has lost its leases: a renewal of a free slot there
        that no one else holds takes it back. group_id "" renews nothing (an actor without a slot says
        its incarnation): True."""
        self.see_incarnation(actor_id, incarnation)
        if not group_id:
            return True
        group = self.open.get(group_id)
        free = group is not None and slot in group.free_slots()
        lease = group.leases.get(slot) if free else None
        if lease is None and free and group.from_log:
            lease = group.leases[slot] = Lease(actor_id, incarnation, now, now)
        if lease is None or not lease.held_by(actor_id, incarnation):
            self.leases.lost += 1
            return False
        lease.renewed = now
        self.leases.renewed += 1
        return True

    def see_incarnation(self, actor_id: str, incarnation: str) -> int:
        """Note the incarnation an actor's message came with. A new one for a known actor (the actor
        restarted) releases every lease its predecessor held at once: the next assign hands those
        slots out again, not counted as lapsed. A retired incarnation (a late message of the dead
        process) changes nothing. Returns the number of leases released."""
        if not actor_id or not incarnation:
            return 0
        known = self.incarnations.get(actor_id)
        if known == incarnation or incarnation in self.retired:
            return 0
        self.incarnations[actor_id] = incarnation
        self.incarnations.move_to_end(actor_id)
        while len(self.incarnations) > KNOWN_ACTORS:
            self.incarnations.popitem(last=False)
        if known is None:
            return 0
        self.retired[known] = None
        while len(self.retired) > RETIRED_INCARNATIONS:
            self.retired.popitem(last=False)
        released = 0
        for group in self.open.values():
            for slot in [s for s, lease in group.leases.items() if lease.held_by(actor_id, known)]:
                del group.leases[slot]
                released += 1
        self.leases.released_restart += released
        log.info(
            "%s restarted (incarnation %s after %s): released its %d leases",
            actor_id,
            incarnation[:8],
            known[:8],
            released,
        )
        return released

    def waiting_on(self) -> dict[str, int]:
        """What the open groups wait for: unfilled slots by the actor whose lease they are under
        ("" for slots no one holds), for the status's stall report (deploy/status.py)."""
        held: dict[str, int] = {}
        for group in self.open.values():
            for slot in group.free_slots():
                lease = group.leases.get(slot)
                key = lease.actor_id if lease is not None else ""
                held[key] = held.get(key, 0) + 1
        return held

    def oldest_renewals(self) -> dict[str, float]:
        """Each lease holder's oldest last renewal (the clock assign and renew are given) among the
        unfilled slots of the open groups: an actor that stopped renewing shows here."""
        oldest: dict[str, float] = {}
        for group in self.open.values():
            for slot in group.free_slots():
                lease = group.leases.get(slot)
                if lease is not None:
                    oldest[lease.actor_id] = min(lease.renewed, oldest.get(lease.actor_id, lease.renewed))
        return oldest

    def _assignment(self, group: Group, slot: int) -> Assignment:
        seed = self.rng.randrange(SEED_RANGE)
        # SGE: the members spread their strategy temperatures over the configured range (a guided
        # revision takes its candidate's place in the spread)
        size = self.cfg.group_size
        strategy_temperature = self.sge.strategy_temperature(slot % size, size) if self.sge else None
        a = Assignment(
            group.group_id,
            slot,
            group.task,
            group.variation,
            group.mode,
            seed,
            strategy_temperature=strategy_temperature,
        )
        if slot in group.guided:
            a.mode, a.guidance, a.temperature = GUIDED, group.guidance[slot], self.herl.temperature
        return a

    def add(self, traj: Trajectory, nbytes: int = 0) -> bool:
        """Accept a trajectory (`nbytes`: its encoded size, for packing batches); False if it is
        a duplicate (already held or its slot is filled)."""
        if (
            traj.episode_id in self.episode_ids
            or traj.group_id in self.served
            or any(traj.group_id in b.group_ids for b in self.in_flight.values())
        ):
            return False
        group = self.open.get(traj.group_id)
        if traj.mode == GUIDED:  # a revision: its group is open and guiding (a replayed log rebuilt it so)
            if group is None or traj.slot not in group.guided or traj.slot in group.revisions:
                return False
            group.revisions[traj.slot] = traj
            group.sizes[traj.slot] = nbytes
            group.leases.pop(traj.slot, None)
            self.episode_ids.add(traj.episode_id)
            if len(group.revisions) == len(group.guided):
                self._close(group)
            return True
        if not 0 <= traj.slot < self.cfg.group_size:
            return False
        if group is None:  # unknown group: a replayed log, or a buffer restarted mid-group
            group = Group(traj.group_id, traj.task, traj.variation, traj.mode, self.cfg.group_size, from_log=True)
            self.open[traj.group_id] = group
        if traj.slot in group.trajectories or traj.mode != group.mode:
            return False
        group.trajectories[traj.slot] = traj
        group.sizes[traj.slot] = nbytes
        group.leases.pop(traj.slot, None)
        self.episode_ids.add(traj.episode_id)
        if group.complete:
            self._guide_or_close(group, time.time())  # the clock assign() is given
        return True

    def _guide_or_close(self, group: Group, now: float) -> None:
        """A group whose members are all in: HeRL opens its guided slots when none solved the task,
        else (or without HeRL) it is ready for the learner."""
        members = [group.trajectories[s] for s in range(group.size)]
        candidates = hindsight_candidates([t.score for t in members], self.herl.max_candidates) if self.herl else []
        if not candidates:
            self.ready[group.group_id] = self.open.pop(group.group_id)
            return
        for k, member in enumerate(candidates):
            slot = group.size + k
            group.guided[slot] = member
            group.guidance[slot] = guidance_text(members[member])
        group.guided_since = now
        self.hindsight.groups_guided += 1
        self.hindsight.guided_episodes += len(candidates)

    def _close(self, group: Group) -> None:
        """The group with its revisions in (or timed out): insertion and bonus, then ready."""
        members = [group.trajectories[s] for s in range(group.size)]
        scores = [t.score for t in members]
        revised = sorted(group.revisions)  # guided slots whose episode arrived
        rng = random.Random(group.group_id)  # the same choice when a restarted buffer replays its log
        chosen = insertion(scores, [group.revisions[g].score for g in revised], rng)
        for g in revised:
            member, revision = group.guided[g], group.revisions[g]
            bonus = self.herl.alpha * (revision.score - scores[member])
            members[member] = dataclasses.replace(members[member], score_bonus=bonus)
            self.hindsight.bonus_paid += bonus
        if chosen.revision is not None:
            revision = group.revisions[revised[chosen.revision]]
            members[chosen.slot] = dataclasses.replace(revision, slot=chosen.slot, hindsight=True)
            group.sizes[chosen.slot] = group.sizes[revised[chosen.revision]]
            self.hindsight.revisions_inserted += 1
            self.hindsight.revisions_beating_best += int(revision.score > max(scores))
        else:  # no revision as good as the best original: a copy of it takes the slot, not as hindsight
            best = scores.index(max(scores))
            members[chosen.slot] = dataclasses.replace(
                members[best], slot=chosen.slot, episode_id=f"{members[best].episode_id}-copy"
            )
            group.sizes[chosen.slot] = group.sizes[best]
        group.trajectories = dict(enumerate(members))
        self.ready[group.group_id] = self.open.pop(group.group_id)
        log.info(
            "guided group %s closed: %d of %d revisions in, best original %g, %s in slot %d",
            group.group_id[:8],
            len(revised),
            len(group.guided),
            max(scores),
            f"a revision scoring {members[chosen.slot].score:g}" if chosen.hindsight else "a copy of the best original",
            chosen.slot,
        )

    def expire_guidance(self, now: float) -> None:
        """Guiding groups past herl.guided_timeout_s go on with the revisions they have."""
        if not self.herl:
            return
        for group in [g for g in self.open.values() if g.guided and now - g.guided_since > self.herl.guided_timeout_s]:
            self.hindsight.guided_timeouts += len(group.guided) - len(group.revisions)
            self._close(group)

    def start_round(self, learner_version: int) -> None:
        """sync: the learner asks for a batch at `learner_version`; past the round's version (its step
        and push are done: the servers serve it), the next round's groups may be handed out."""
        if self.sync_groups and learner_version > self.round_version:
            self.round_version, self.round_groups = learner_version, 0

    def take_batch(
        self, learner_version: int, num_groups: int, max_staleness: int, max_bytes: int, now: float
    ) -> tuple[BatchInFlight | None, list[Group]]:
        """(the batch handed out, groups dropped as stale). Only a full batch of num_groups groups
        is handed out, split into parts of at most `max_bytes` encoded (the learner's limit). Its
        groups are served, not yet used: they go back to the ready groups unless confirm()ed
        within batch_confirm_timeout_s (requeue_unconfirmed)."""
        stale = [g for g in self.ready.values() if learner_version - g.oldest_version > max_staleness]
        for g in stale:
            self.mark_served(g.group_id)
        if len(self.ready) < num_groups:
            return None, stale
        groups = list(self.ready.values())[:num_groups]
        parts = pack_parts(groups, max_bytes - BATCH_ENVELOPE_BYTES)  # ValueError: a trajectory alone is too big
        batch = BatchInFlight(uuid.uuid4().hex, groups, parts, now)
        for g in groups:
            del self.ready[g.group_id]
        self.in_flight[batch.batch_id] = batch
        return batch, stale

    def confirm(self, batch_id: str) -> list[str] | None:
        """The learner has used the batch: its groups are served for good. Their ids, or None for
        a batch not in flight (confirmed before, or re-served since)."""
        batch = self.in_flight.pop(batch_id, None)
        if batch is None:
            return None
        for g in batch.groups:
            self.mark_served(g.group_id)
        return batch.group_ids

    def requeue_unconfirmed(self, now: float, all_batches: bool = False) -> int:
        """Unconfirmed batches older than batch_confirm_timeout_s (every one if `all_batches`: the
        learner restarted) give their groups back, ahead of the other ready groups. Returns the
        number of groups requeued."""
        expired = [
            b for b in self.in_flight.values() if all_batches or now - b.served_at > self.cfg.batch_confirm_timeout_s
        ]
        back = [g for b in expired for g in b.groups]
        for b in expired:
            del self.in_flight[b.batch_id]
        rest = list(self.ready.values())
        self.ready = OrderedDict((g.group_id, g) for g in back + rest)
        return len(back)

    def mark_served(self, group_id: str) -> None:
        self.ready.pop(group_id, None)
        self.open.pop(group_id, None)
        self.served.add(group_id)

    def is_duplicate(self, traj: Trajectory) -> bool:
        """The same episode already arrived (a re-sent upload): answered Ack(duplicate=True)."""
        return traj.episode_id in self.episode_ids

    def check_lease(self, traj: Trajectory) -> None:
        """The door for an upload (issue 14): a new trajectory must answer a slot this buffer handed
        out, in the group's task, variation and mode; else ProtocolError(reason), nothing stored.
        A slot handed out again after its lease lapsed takes the first complete episode, from either
        actor (a late one of the lapsed holder too): the other is refused slot_filled, and its actor,
        if still playing, learns it at its next renewal (lease_lost). So each slot holds one episode,
        and every acknowledged episode is in the log exactly once."""

        def refuse(reason: str, detail: str) -> None:
            raise ProtocolError(reason, f"trajectory {traj.episode_id[:64]!r}: {detail}")

        group = self.open.get(traj.group_id)
        if group is None:
            served = traj.group_id in self.served or traj.group_id in self.ready
            refuse("no_lease", "its group is complete or served" if served else "its group was never handed out")
        if traj.hindsight or traj.score_bonus:
            refuse("invalid", "hindsight and score_bonus are the buffer's to set")
        guided = traj.slot in group.guided
        if not (0 <= traj.slot < group.size or guided):
            refuse("no_lease", f"slot {traj.slot} is not in a group of {group.size}")
        mode = GUIDED if guided else group.mode
        if (traj.task, traj.variation, traj.mode) != (group.task, group.variation, mode):
            refuse("wrong_group", f"task, variation or mode differ from its slot's ({mode})")
        if traj.slot in group.trajectories or traj.slot in group.revisions:
            refuse("slot_filled", f"slot {traj.slot} already holds another episode")
        if traj.slot not in group.leases and not group.from_log:
            refuse("no_lease", f"slot {traj.slot} was not handed out")

    def held_bytes(self) -> int:
        """Bytes of the trajectories held unserved (open and ready groups): security.max_held_trajectory_bytes."""
        groups = list(chain(self.open.values(), self.ready.values()))
        held = chain.from_iterable(chain(g.trajectories.values(), g.revisions.values()) for g in groups)
        return sum(trajectory_bytes(t) for t in held)


def trajectory_bytes(traj: Trajectory) -> int:
    """A trajectory's size in memory, near enough: its arrays and its texts."""
    arrays = (traj.prompt_token_ids, traj.prompt_offsets, traj.response_token_ids, traj.response_offsets)
    arrays += (traj.behaviour_logprobs, traj.tip_spans, traj.policy_versions, traj.num_memories)
    texts = chain(traj.observations, traj.actions, traj.generated_texts, traj.locations, traj.inventories)
    texts = chain(texts, (traj.start_inventory, traj.goal_progress))
    return sum(a.nbytes for a in arrays) + sum(len(t) for t in texts)


@dataclass
class HindsightCounts:
    """HeRL's counts since start (the service exports them): groups held for revisions, guided episodes
    handed out, revisions that took a slot and those that beat their group's best original, the
    bonus paid in all, guided episodes given up at herl.guided_timeout_s."""

    groups_guided: int = 0
    guided_episodes: int = 0
    revisions_inserted: int = 0
    revisions_beating_best: int = 0
    bonus_paid: float = 0.0
    guided_timeouts: int = 0


@dataclass
class BatchInFlight:
    """A batch handed to the learner and not yet confirmed: its groups, and its trajectories in
    parts that each fit the learner's message limit (one Batch message per part)."""

    batch_id: str
    groups: list[Group]
    parts: list[list[Trajectory]]
    served_at: float  # when its first part was handed out

    @property
    def group_ids(self) -> list[str]:
        return [g.group_id for g in self.groups]


def pack_parts(groups: list[Group], budget: int) -> list[list[Trajectory]]:
    """The groups' trajectories in order, cut into consecutive parts of at most `budget` encoded
    bytes each. ValueError if one trajectory alone is over the budget (the door refuses those:
    replay_buffer.max_trajectory_bytes)."""
    parts: list[list[Trajectory]] = [[]]
    used = 0
    for g in groups:
        for slot, traj in sorted(g.trajectories.items()):
            size = g.sizes.get(slot, 0)
            if size > budget:
                raise ValueError(f"trajectory {traj.episode_id} is {size} bytes, over the learner's {budget}")
            if parts[-1] and used + size > budget:
                parts.append([])
                used = 0
            parts[-1].append(traj)
            used += size
    return parts


# BufferLog record tags.
TRAJECTORY_TAG = b"T"  # an accepted trajectory, its encoded frames (pack_frames)
SERVED_TAG = b"S"  # a group id: confirmed by the learner, or dropped as stale
LOG_TAGS = (TRAJECTORY_TAG, SERVED_TAG)


@dataclass
class Replayed:
    """What a replay found: records applied, records skipped by fault, bytes cut from a torn tail."""

    records: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # fault -> count (protocol/records.py's faults, undecodable)
    skipped_bytes: int = 0  # bytes of skipped records before intact ones: left in the file
    truncated_bytes: int = 0  # a torn tail: cut so appends start clean


class BufferLog:
    """Append-only log of checksummed records (protocol/records.py): `T` + an accepted trajectory,
    `S` + a served group id. A record is in the OS before the call returns (durability `flush`),
    on disk (`fsync`), or on disk at the next sync() (`group`: the caller holds the Acks until then)."""

    def __init__(self, path: Path, durability: Durability):  # replay_buffer.durability
        self.path, self.durability = path, durability
        self.file = open(path, "ab")
        self.unsynced = 0  # records written since the last fsync
        self.fsyncs = 0

    def append_trajectory(self, frames) -> None:
        self._append(TRAJECTORY_TAG, pack_frames(frames))

    def append_served(self, group_id: str) -> None:
        self._append(SERVED_TAG, group_id.encode())

    def _append(self, tag: bytes, payload: bytes) -> None:
        self.file.write(frame_record(tag, payload))
        self.file.flush()  # in the OS before the Ack: a crashed process loses nothing
        self.unsynced += 1
        if self.durability == Durability.fsync:
            self.sync()

    def sync(self) -> None:
        """fsync what was written since the last one (group commit: once for many records)."""
        if self.unsynced:
            os.fsync(self.file.fileno())
            self.unsynced = 0
            self.fsyncs += 1

    def close(self) -> None:
        self.sync()
        self.file.close()

    @staticmethod
    def read(path: Path) -> tuple[list[Trajectory], list[str], Scan]:
        """A log's intact records as (the trajectories, the served group ids, the scan): for audits and
        benchmarks; the buffer itself replays (replay)."""
        found = scan(path.read_bytes(), LOG_TAGS)
        trajectories = [decode(unpack_frames(p)) for tag, p in found.records if tag == TRAJECTORY_TAG]
        served = [p.decode() for tag, p in found.records if tag == SERVED_TAG]
        return trajectories, served, found

    @classmethod
    def replay(cls, path: Path, buffer: ReplayBuffer) -> Replayed:
        """Feed a previous run's intact records into `buffer`. A corrupt record is skipped and
        counted and every intact one after it kept (the file is not changed); only a torn tail
        (bytes after the last intact record that form no record) is cut."""
        result = Replayed()
        if not path.exists():
            return result
        data = path.read_bytes()
        if data and not data.startswith(RECORD_MAGIC):
            raise RuntimeError(
                f"{path} is not a checksummed buffer log (written before records had checksums): "
                "start the run in a new run_dir (protocol/README.md, Records at rest)"
            )
        found: Scan = scan(data, LOG_TAGS)
        skipped = dict(found.skipped)
        for tag, payload in found.records:
            try:
                if tag == TRAJECTORY_TAG:
                    buffer.add(decode(unpack_frames(payload)), len(payload))
                else:
                    buffer.mark_served(payload.decode())
            except (ProtocolError, ValueError) as exc:  # intact but not ours to read (msgpack errors are ValueErrors)
                skipped["undecodable"] = skipped.get("undecodable", 0) + 1
                log.warning("skipping an undecodable %r record in %s: %s", tag, path, str(exc)[:200])
                continue
            result.records += 1
        result.skipped, result.skipped_bytes = skipped, found.skipped_bytes
        if found.torn_tail_bytes:  # a record torn by a crash mid-write: cut it so appends start clean
            result.truncated_bytes = found.torn_tail_bytes
            with open(path, "r+b") as f:
                f.truncate(found.intact_end)
        return result
