"""Configuration of the local launcher (deploy/launch.py)."""

from __future__ import annotations

from dataclasses import dataclass

from common.config import at_least, positive


@dataclass
class LaunchConfig:
    num_env_actors: int = 2  # env actor processes (each one ScienceWorld JVM)
    # the learner's torchrun ranks on its host (data-parallel FSDP2, one device each: learner.gpus, else
    # every GPU shown); 1 = one plain process. The launcher starts `torchrun --standalone --nproc_per_node=N`
    learner_ranks: int = 1
    progress_every_s: float = 15.0  # progress line interval
    timeout_s: float = 3600.0  # the whole bounded run; past it everything is stopped
    stop_grace_s: float = 20.0  # SIGTERM -> SIGKILL delay at shutdown
    # Supervision: a role that exits (other than the learner finishing) is started again after a
    # backoff of backoff_s * 2^(n-1) (n: its restarts within restart_window_s), capped at
    # backoff_max_s. A role restarted more than restart_budget times within restart_window_s
    # stops the run. The learner resumes from its newest checkpoint, the buffer replays its log,
    # the memory service reopens its database.
    restart_budget: int = 5  # restarts per role within restart_window_s; 0 = stop at the first crash
    restart_window_s: float = 600.0  # the window restart_budget and the backoff count restarts in
    backoff_s: float = 2.0  # the first restart's delay, doubled per restart within the window
    backoff_max_s: float = 60.0  # the longest restart delay
    # Hang detection: a role whose heartbeat (<run_dir>/heartbeats/<name>, touched by its own work
    # loop: common/heartbeat.py) stays still this long is killed and restarted, a restart with reason
    # `hung`. Before its first beat a process has max(this, startup_timeout_s) (model loads, JVMs).
    # Must exceed the per-request timeouts its waits retry after (pipeline/config.py). 0 = off.
    hang_timeout_s: float = 600.0

    def validate(self) -> None:
        at_least("num_env_actors", self.num_env_actors, 1)
        at_least("learner_ranks", self.learner_ranks, 1)
        positive("timeout_s", self.timeout_s)
        at_least("restart_budget", self.restart_budget, 0)
        positive("restart_window_s", self.restart_window_s)
        at_least("backoff_s", self.backoff_s, 0)
        at_least("backoff_max_s", self.backoff_max_s, self.backoff_s)
        at_least("hang_timeout_s", self.hang_timeout_s, 0)
