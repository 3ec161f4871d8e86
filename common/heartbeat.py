"""The heartbeat of real progress: a file per process, <run_dir>/heartbeats/<name>, whose mtime is
the last time the process's own work loop moved. The launcher (deploy/launch.py) kills and restarts
a role whose file stays still for launch.hang_timeout_s: a Ping answered by a front thread or a
metrics page served by its own thread says the process is alive, not that it works.

Each role calls beat() where its work advances (docs/reliability.md, "Hang detection"): an env
actor per turn and per answer of its wait loops, the learner per micro-batch and per attempt of its
waits, the buffer and the memory service per iteration of their request loops (idle ones too), the
policy server when it is idle or completes a request. A beat costs a clock read; the file is written
at most once per MIN_INTERVAL_S.

Lanes: a process whose work runs in several threads (an env actor's envs) beats one lane per thread;
the file holds the oldest lane's last beat, so one stuck thread stops the process's heartbeat.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

HEARTBEAT_DIR = "heartbeats"  # under the run directory
MIN_INTERVAL_S = 1.0  # at most one write a second


def heartbeat_path(run_dir: str | Path, name: str) -> Path:
    """The heartbeat file of the process `name` (its name in the run: env_actor0, learner, ...)."""
    return Path(run_dir) / HEARTBEAT_DIR / name


def last_beat(path: str | Path) -> float | None:
    """The wall-clock time of the last beat written to `path`; None if none was."""
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return None


class Heartbeat:
    """Writes a process's heartbeat file, rate-limited; a no-op until start() gives it a path."""

    def __init__(self, min_interval_s: float = MIN_INTERVAL_S, clock=time.time):
        self.min_interval_s, self.clock = min_interval_s, clock
        self.path: Path | None = None
        self.lanes: dict[str, float] = {}  # lane -> wall-clock time of its last beat
        self.written = float("-inf")  # when the file was last written
        self.writes = 0
        self._lock = threading.Lock()

    def start(self, path: str | Path) -> None:
        """Write beats to `path` from now on ("" leaves it off). Nothing is written before the
        first beat: until then the launcher gives the process its start-up allowance."""
        self.path = Path(path) if path else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def beat(self, lane: str = "main") -> None:
        now = self.clock()
        self.lanes[lane] = now
        if self.path is None or now - self.written < self.min_interval_s:
            return
        if not self._lock.acquire(blocking=False):  # another thread is writing this very moment
            return
        try:
            oldest = min(self.lanes.values())
            try:
                os.utime(self.path, (oldest, oldest))
            except FileNotFoundError:
                self.path.touch()
                os.utime(self.path, (oldest, oldest))
            self.written = now
            self.writes += 1
        finally:
            self._lock.release()


# The process's heartbeat: common.process.run_role (and the policy server's main) start it with the
# path the run's facts name (RunFacts.heartbeat_path); the roles call beat().
HEARTBEAT = Heartbeat()


def beat(lane: str = "main") -> None:
    """One unit of real progress of this process (of its thread `lane`)."""
    HEARTBEAT.beat(lane)
