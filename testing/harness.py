"""A run of the whole pipeline started from Python (the end-to-end tests, the benchmarks): empo2-run
as a process of its own, waited on and stopped the way an operator would.

The launcher runs in a session of its own (spawn_command) with its output in <run_dir>/launch.out.
wait_for() asks a condition until it holds and fails at once, with the launcher's last lines, when
the launcher ends first or the run's deadline passes; stop() sends the launcher SIGTERM, and it
stops every role it started before it exits (deploy/launch.py).
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from common.process import spawn_command, stop_group
from deploy.monitor import scrape, total
from deploy.run_state import read_state
from pipeline.config import PipelineConfig, load_config
from replay_buffer.buffer import BufferLog

T = TypeVar("T")
# what a role leaves behind when it is killed badly: vLLM's engine cores and workers, ScienceWorld's JVMs
LEFTOVER_NAMES = re.compile(r"VLLM|java", re.I)


# Set in the environment of a LaunchedRun given a `mark`: inherited by every process the run starts (its
# roles, their vLLM workers and JVMs), so leftover_processes(mark) sees that run's processes and no other's.
RUN_MARK_ENV = "EMPO2_RUN_MARK"


def leftover_processes(mark: str | None = None) -> dict[int, str]:
    """pid -> command line of every process of the kinds a role leaves behind when it is killed badly;
    compared before and after a run, the difference is what the run left. `mark`: only the processes of
    the LaunchedRun started with it (another pipeline running beside it, e.g. an evaluation, is not its)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                comm = (entry / "comm").read_text().strip()
                if mark is not None and f"{RUN_MARK_ENV}={mark}".encode() not in (entry / "environ").read_bytes():
                    continue
            except OSError:
                continue
            if LEFTOVER_NAMES.search(comm) or LEFTOVER_NAMES.search(cmdline.split(" ")[0]):
                found[int(entry.name)] = f"{comm}: {cmdline[:200]}"
    return found


class RunEnded(RuntimeError):
    """The launcher ended, or the run's deadline passed, while a condition was waited for."""


class LaunchedRun:
    """empo2-run with `overrides` in `run_dir` (made if missing), started at once. `timeout_s`: the
    deadline of every wait; `cwd`: the launcher's working directory (relative paths of the config)."""

    def __init__(
        self,
        overrides: list[str],
        run_dir: Path,
        timeout_s: float = math.inf,
        cwd: Path | None = None,
        mark: str | None = None,
    ):
        """`mark`: set as RUN_MARK_ENV in the environment of every process of the run (leftover_processes)."""
        self.run_dir = run_dir
        self.overrides = [*overrides, f"run_dir={run_dir}"]
        self.cfg = load_config(self.overrides)
        self.out = run_dir / "launch.out"
        run_dir.mkdir(parents=True, exist_ok=True)
        env = {RUN_MARK_ENV: mark} if mark is not None else None
        self.launcher = spawn_command("empo2-run", self.overrides, self.out, cwd=cwd, env_extra=env)
        self.deadline = time.monotonic() + timeout_s

    def alive(self) -> bool:
        return self.launcher.poll() is None

    def tail(self, chars: int = 5000) -> str:
        """The launcher's last output."""
        return self.out.read_text(errors="replace")[-chars:]

    def wait_for(self, what: str, condition: Callable[[], T], poll_s: float = 1.0) -> T:
        """condition()'s first true value, asked every `poll_s`; RunEnded if the launcher ends or
        the deadline passes first."""
        while True:
            value = condition()
            if value:
                return value
            if not self.alive():
                raise RunEnded(f"the launcher ended while waiting for {what}:\n{self.tail()}")
            if time.monotonic() >= self.deadline:
                raise RunEnded(f"timed out waiting for {what}:\n{self.tail()}")
            time.sleep(poll_s)

    def roles_up(self) -> dict[str, dict]:
        """The launcher's roles (deploy/run_state.py) once it has started them and each one runs;
        {} before."""
        roles = read_state(self.run_dir).get("roles", {})
        return roles if roles and all(role["up"] for role in roles.values()) else {}

    def wait_until_up(self) -> dict[str, dict]:
        return self.wait_for("every role up", self.roles_up)

    def metric(self, kind: str, name: str, index: int = 0) -> float:
        """A metric of process `index` of role `kind`, summed over its labels; 0.0 while it does
        not answer."""
        return total(scrape(self.cfg.metrics.host, self.cfg.metrics.port(kind, index)), name)

    def wait(self) -> int:
        """The launcher's exit status once the run ends, waited for until the deadline."""
        return self.launcher.wait(timeout=max(self.deadline - time.monotonic(), 1.0))

    def stop(self, grace_s: float = 180.0) -> None:
        """SIGTERM the launcher, which stops every role and exits; what is left of its process
        group after `grace_s` is killed. Nothing happens to a run that has ended."""
        stop_group(self.launcher, grace_s)


ACKNOWLEDGED = re.compile(r"episode (\S+) of group \S+ acknowledged")  # an env actor's log line


def episode_audit(cfg: PipelineConfig) -> dict:
    """The buffer's log of a finished run against what its env actors were told (their logs): the
    episodes logged, those logged twice, the groups recorded as used twice, the acknowledged episodes
    missing from the log, and the records skipped as corrupt. A clean run has every list empty."""
    trajectories, used, found = BufferLog.read(cfg.run_path(cfg.replay_buffer.log_file))
    logged, groups = Counter(t.episode_id for t in trajectories), Counter(used)
    acknowledged = set()
    for actor_log in (Path(cfg.run_dir) / "logs").glob("env_actor*.log"):
        acknowledged |= set(ACKNOWLEDGED.findall(actor_log.read_text(errors="replace")))
    return {
        "logged": sum(logged.values()),
        "acknowledged": len(acknowledged),
        "logged_twice": sorted(e for e, n in logged.items() if n > 1),
        "groups_used_twice": sorted(g for g, n in groups.items() if n > 1),
        "acknowledged_not_logged": sorted(acknowledged - set(logged)),
        "skipped_records": len(found.skipped),
    }
