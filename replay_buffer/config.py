"""Configuration of the replay buffer (rollout coordinator). Defaults are the paper's recipe
(shared/reference/empo2.md); it also reads the shared `env` section (ScienceWorld's
simplification, for the variation lists)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReplayBufferConfig:
    tasks: list[str] = field(default_factory=lambda: ["find-living-thing"])  # ScienceWorld tasks
    variations_per_task: int = 5  # train on the first N train variations of each task
    group_size: int = 8  # G: rollouts per (task, variation) group, sharing one mode
    p_memory: float = 0.25  # p: probability that a group rolls out with tips
    q_off_policy: float = 0.68  # q: P(off-policy update | tip rollout)
    max_open_groups: int = 16  # groups handed out but not yet complete
    max_ready_groups: int = 32  # backpressure: no new groups while this many wait (>= learner.groups_per_step)
    assignment_timeout_s: float = 1800.0  # a slot not returned by then is handed out again
    batch_poll_s: float = 2.0  # the learner's wait before asking again while too few groups are complete
    log_file: str = "buffer.log"  # inside run_dir: append-only log of accepted trajectories
