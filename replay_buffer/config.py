"""Configuration of the replay buffer (rollout coordinator). Defaults are the paper's recipe
(docs/method.md); it also reads the shared `env` section (ScienceWorld's
simplification, for the variation lists)."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.choices import Choice
from common.config import at_least, check, positive, scienceworld_tasks, within
from protocol.codec import DEFAULT_MAX_MESSAGE_BYTES
from protocol.messages import BATCH_ENVELOPE_BYTES


class Durability(Choice):
    """When an accepted trajectory's log record is on disk, relative to its Ack (replay_buffer.durability)."""

    flush = "flush"  # written to the OS before the Ack: survives the process's kill -9, not a power loss
    fsync = "fsync"  # fsync'd before each Ack: survives a power loss too, one disk sync per record
    group = "group"  # group commit: Acks wait for one fsync every group_commit_ms covering all their records


@dataclass
class ReplayBufferConfig:
    tasks: list[str] = field(default_factory=lambda: ["find-living-thing"])  # ScienceWorld tasks
    variations_per_task: int = 5  # train on the first N train variations of each task
    group_size: int = 8  # G: rollouts per (task, variation) group, sharing one mode
    p_memory: float = 0.25  # p: probability that a group rolls out with tips
    q_off_policy: float = 0.68  # q: P(off-policy update | tip rollout)
    max_open_groups: int = 16  # groups handed out but not yet complete
    max_ready_groups: int = 32  # backpressure: no new groups while this many wait (>= learner.groups_per_step)
    # A slot is leased to the actor playing it while that actor renews it (LeaseRenewal, every
    # env_actor.lease_renew_s, from a thread of its own: not tied to a turn's length); a lease not
    # renewed for lease_ttl_s lapses and the slot is handed out again. 120 s: six renewal periods,
    # and four times a renewal's own timeout (env_actor.buffer_timeout_s), so a busy buffer or a slow
    # renewal never loses a live actor's slot; a killed actor's slot is free within it (a restarted
    # one frees it at once: its new incarnation releases its predecessor's leases). docs/reliability.md
    lease_ttl_s: float = 120.0
    # The longest a slot stays one lease however often it is renewed: an actor whose process lives but
    # whose episode never ends (hang detection off, launch.hang_timeout_s=0) loses it then.
    assignment_timeout_s: float = 1800.0
    batch_poll_s: float = 2.0  # the learner's wait before asking again while too few groups are complete
    log_file: str = "buffer.log"  # inside run_dir: append-only log of accepted trajectories
    durability: Durability = Durability.flush  # flush | fsync | group: when a record is on disk vs its Ack
    group_commit_ms: float = 5.0  # durability=group: the longest an Ack waits for the fsync covering it
    # A batch served to the learner is re-served unless the learner confirms it (BatchConfirm) within this
    # (a learner that asks for a new batch without confirming the last one has restarted: re-served at once).
    # Liveness releases it already: the learner is the only consumer, so a killed learner's batch waits for
    # no one until its restarted process asks (re-served at once), and a hung one is restarted by hang
    # detection. The bound only has to exceed the longest step and push (re-serving a batch the learner is
    # still stepping on would use its groups twice), so it stays generous (docs/reliability.md, Waits).
    batch_confirm_timeout_s: float = 1800.0
    # Encoded trajectories larger than this are refused at the door (ErrorReply too_large): every accepted
    # one must fit a Batch the learner accepts (protocol DEFAULT_MAX_MESSAGE_BYTES, less the batch's envelope).
    max_trajectory_bytes: int = 32 * 1024 * 1024

    def validate(self) -> None:
        check(bool(self.tasks), "tasks", "needs at least one ScienceWorld task")
        scienceworld_tasks("tasks", self.tasks)
        within("p_memory", self.p_memory, 0.0, 1.0)
        within("q_off_policy", self.q_off_policy, 0.0, 1.0)
        at_least("variations_per_task", self.variations_per_task, 1)
        check(self.group_size >= 2, "group_size", f"GRPO normalises within a group: >= 2, got {self.group_size}")
        at_least("max_open_groups", self.max_open_groups, 1)
        at_least("batch_poll_s", self.batch_poll_s, 0)
        positive("lease_ttl_s", self.lease_ttl_s)
        positive("assignment_timeout_s", self.assignment_timeout_s)
        positive("batch_confirm_timeout_s", self.batch_confirm_timeout_s)
        positive("group_commit_ms", self.group_commit_ms)
        largest = DEFAULT_MAX_MESSAGE_BYTES - BATCH_ENVELOPE_BYTES
        check(
            0 < self.max_trajectory_bytes <= largest,
            "max_trajectory_bytes",
            f"must be in (0, {largest}] (a Batch the learner accepts, less its envelope), got {self.max_trajectory_bytes}",
        )
