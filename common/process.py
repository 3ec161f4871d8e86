"""Process plumbing shared by every role: signals become clean exits, so `finally` blocks run
(closing ScienceWorld's JVMs, flushing stores) when the launcher or systemd stops a process."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import RunFacts
from common.heartbeat import HEARTBEAT

log = logging.getLogger(__name__)

# The environment every role process runs in, on top of the parent's: unbuffered output (a log
# line is in the file when it happens, also before a crash), no Hugging Face Hub access (models
# are prepared before any role starts: common/model_prep.py), and no tokenizers thread pool
# (it warns, and can deadlock, when a process that used it forks). No progress bars: tqdm's (the
# weight loads and saves of transformers and vLLM, the embedder's batches) wrote a carriage-return
# line per update into the role logs, hiding the lines around them.
ROLE_ENV = {
    "PYTHONUNBUFFERED": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}
# ... and, unless the operator's environment says otherwise, OpenMP threads that sleep at a barrier
# instead of spinning (libgomp spins first by default): the learner, vLLM's CPU workers and the
# memory service's embedder share the cores, and spinning threads took them from one another: a learner
# step beside a busy policy server and the generation beside it each ran several times slower than
# alone; passive, each gets a fair half (benchmarks/colocation.py).
ROLE_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


def lower_cpu_priority(nice: int) -> None:
    """Run this process, and the threads and processes it starts later (vLLM's workers, ScienceWorld's
    JVM), at CPU niceness `nice` (never lowering an operator's higher one). Linux shares the CPU
    first between autogroups (one per session, and a launched role is a session of its own) and only
    then by niceness, so a session leader sets its autogroup's niceness too, where the kernel has
    autogroups; a process run from a shell leaves the shell's session alone."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice <= current:
        return
    os.setpriority(os.PRIO_PROCESS, 0, nice)  # on Linux the calling thread; threads started later inherit it
    if os.getsid(0) == os.getpid():
        try:
            Path("/proc/self/autogroup").write_text(str(nice))
        except OSError:  # no autogroups (kernel option off): the niceness alone decides
            pass


def role_env(env_extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """The environment of a role process: ROLE_ENV_DEFAULTS, then the parent's, then ROLE_ENV and
    `env_extra`; a None in `env_extra` removes that variable."""
    env = {**ROLE_ENV_DEFAULTS, **os.environ, **ROLE_ENV, **(env_extra or {})}
    return {k: v for k, v in env.items() if v is not None}


def spawn_role(
    module: str,
    args: list[str],
    log_path: Path,
    env_extra: dict[str, str | None] | None = None,
    cwd: Path | None = None,
    exec_prefix: tuple[str, ...] = (),
) -> subprocess.Popen:
    """Start `python -m <module> *args` (a role's main, or any command of the project) with ROLE_ENV
    (and `env_extra`), stdout and stderr appended to `log_path`, in a session of its own: stopping
    its process group (stop_group) also stops its JVM, vLLM workers and resource trackers.
    `exec_prefix`: a command that execs the rest (e.g. `ip netns exec NS`), so the pid and the
    group stay the role's. The environment is role_env(env_extra)."""
    env = role_env(env_extra)
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
            [*exec_prefix, sys.executable, "-m", module, *args],
            cwd=cwd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def spawn_command(command: str, args: list[str], log_path: Path, **kwargs) -> subprocess.Popen:
    """spawn_role of a command of the project (empo2-learner, ...): every command runs as
    `python -m pipeline <command> [key=value ...]` (pipeline/roles.py), as the launcher starts it."""
    return spawn_role("pipeline", [command, *args], log_path, **kwargs)


def signal_leader(process: subprocess.Popen, sig: int) -> None:
    """Signal the child alone, not its group: a role told to stop stops its own children in order
    (a SIGTERM to the whole group reached a vLLM worker in the middle of an engine step, and the
    engine core logged a fatal error on an ordinary stop)."""
    try:
        process.send_signal(sig)
    except ProcessLookupError:
        pass


def signal_group(process: subprocess.Popen, sig: int) -> None:
    """Signal the process group of a child started with start_new_session=True."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_group(process: subprocess.Popen, deadline: float) -> bool:
    """Wait until every process of the child's group has exited (or time.monotonic() passes
    `deadline`); True if the group is gone.

    The whole group, not just its leader: helpers that clean up after the leader must be allowed
    to finish. Python's resource tracker unlinks the shared memory a vLLM engine leaves behind
    once its clients are gone; a SIGKILL right after the leader's exit leaked 160 MB of /dev/shm
    per stopped policy server."""
    while True:
        process.poll()  # reap the leader: a zombie still counts as a member of its group
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def group_shm_files(process: subprocess.Popen) -> set[str]:
    """The /dev/shm files that the living processes of the child's group have mapped (a vLLM
    engine's message queues): what a killed role would leave behind."""
    return shm_files(pid for pid in _pids() if _pgid(pid) == process.pid)


def shm_files(pids: Iterable[int]) -> set[str]:
    """The /dev/shm files that the processes `pids` have mapped."""
    return {path for pid in pids for path in _shm_maps(pid)}


def unlink_unmapped(paths: set[str]) -> list[str]:
    """Unlink each of `paths` that no living process maps any more; the paths unlinked. A crashed
    role's resource tracker died with it, so nobody else would: 160-250 MB per vLLM queue."""
    mapped = {path for pid in _pids() for path in _shm_maps(pid)}
    gone = []
    for path in sorted(paths - mapped):
        try:
            os.unlink(path)
            gone.append(path)
        except FileNotFoundError:
            pass
    return gone


@dataclass
class ChildSharedMemory:
    """The SharedMemory segments (/dev/shm/psm_*) that this process's descendants have mapped, taken
    while they run (snapshot), and released after they have exited (release).

    A creator that exits without unlinking its segment (vLLM's engine processes, stopped with their
    group) leaves it to the resource tracker that it shares with this process; the tracker unlinks
    it when this process exits, writing "resource_tracker: There appear to be N leaked
    shared_memory objects to clean up at shutdown" into the log. release() unlinks such a segment
    first and tells the tracker, so a normal stop leaves no segment and no warning."""

    owners: dict[int, set[str]]  # pid -> the segments it had mapped
    # the descendants share this process's tracker: it ran before they started (spawn starts it,
    # fork inherits it); otherwise each has its own, and their segments are left to them
    shared_tracker: bool

    @classmethod
    def snapshot(cls, prefix: str = "psm_") -> ChildSharedMemory:
        from multiprocessing import resource_tracker

        parents = {pid: _ppid(pid) for pid in _pids()}
        below, frontier = [], {os.getpid()}
        while frontier:
            frontier = {pid for pid, parent in parents.items() if parent in frontier}
            below += frontier
        maps = {pid: {p for p in _shm_maps(pid) if Path(p).name.startswith(prefix)} for pid in below}
        shared = getattr(resource_tracker._resource_tracker, "_fd", None) is not None
        return cls({pid: paths for pid, paths in maps.items() if paths}, shared)

    def release(self, timeout_s: float) -> list[str]:
        """Once every owner has exited (waited for up to `timeout_s`; else nothing is touched: a
        creator may still unlink its own), unlink each segment still there that no process maps,
        and unregister it from the shared tracker; the paths unlinked."""
        from multiprocessing import resource_tracker

        if not self.shared_tracker:
            return []
        deadline = time.monotonic() + timeout_s
        while any(alive(pid) for pid in self.owners) and time.monotonic() < deadline:
            time.sleep(0.05)
        if any(alive(pid) for pid in self.owners):
            return []
        gone = unlink_unmapped({path for paths in self.owners.values() for path in paths})
        for path in gone:  # registered by its creator (SharedMemory(create=True)); unlinked by no one
            resource_tracker.unregister("/" + Path(path).name, "shared_memory")
        return gone


def orphaned_semaphores() -> set[str]:
    """joblib/loky named semaphores (/dev/shm/sem.loky-<creator pid>-<random>) whose creator is
    gone. A vLLM CPU worker creates one that loky's resource tracker unlinks at a normal exit; a
    role killed with SIGKILL takes the tracker with it, and its name is not mapped, so
    group_shm_files cannot see it (seen in the fault matrix). A reused pid leaves its file alone."""
    living = set(_pids())
    return {
        str(path)
        for path in Path("/dev/shm").glob("sem.loky-*")
        if (creator := re.match(r"sem\.loky-(\d+)-", path.name)) and int(creator[1]) not in living
    }


# Resolved once: the C library of this process (None outside glibc, e.g. musl or macOS).
_MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)


def release_free_heap() -> bool:
    """Give the heap's free pages back to the kernel (glibc's malloc_trim): whether any were (False
    also without glibc).

    Why: PyTorch on CPU frees a step's activations to glibc, which keeps them. glibc raises its mmap
    threshold each time a large mmapped block is freed, so after the first step the activations come
    from the heap, and steps of other shapes leave holes that the resident memory keeps. Measured in
    one learner process at 4096 micro-batch tokens (`benchmarks.learner_throughput`, group and
    episode steps alternating): the episode steps after a group step stayed at 9.7 GB without the
    trim and went back to 6.5 GB with it; a step's own peak (~9.9 GB) is unchanged. A fixed
    MALLOC_MMAP_THRESHOLD_ bounded it too but made every step ~30% slower (fresh pages zeroed at
    each allocation)."""
    return bool(_MALLOC_TRIM(0)) if _MALLOC_TRIM is not None else False


def status_mb(pid: int | str = "self", field: str = "VmRSS") -> float:
    """A memory field of a process's /proc/<pid>/status in MB (VmRSS resident now, VmHWM its
    high-water mark); 0.0 if the field is missing."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after "pid (comm)" (comm may hold spaces and parentheses):
    state, ppid, ...; [] if the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _ppid(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if len(fields) > 1 else None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (exited, not yet reaped)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _shm_maps(pid: int) -> set[str]:
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return set()
    return {line.split(None, 5)[5] for line in lines if line.count(" ") >= 5 and " /dev/shm/" in line}


def stop_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the child (signal_leader), give its group `grace_s` to exit whole, then SIGKILL
    what is left."""
    signal_leader(process, signal.SIGTERM)
    wait_group(process, time.monotonic() + grace_s)
    signal_group(process, signal.SIGKILL)
    process.wait()


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit in the main thread, like Ctrl-C raises KeyboardInterrupt."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def interrupt_on_sigterm() -> None:
    """SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does: a supervisor (the
    launcher) then takes its Ctrl-C path and stops its children. Its children run in sessions of
    their own, so a SIGTERM that killed the supervisor outright (systemd, a test's clean-up) would
    leave every role running."""

    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def run_async_until_signalled(coro, on_exit=None) -> None:
    """Run an asyncio main until it ends or SIGTERM/SIGINT arrives; always run the cleanup."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        loop.run_until_complete(task)
    except asyncio.CancelledError:
        log.info("stopping on signal")
    finally:
        if on_exit:
            on_exit()
        loop.close()


def run_role(name: str, run: RunFacts, build: Callable[[], Any]) -> None:
    """The main of a synchronous role, given its sections and the run's facts (pipeline/cli.py
    loads and validates them): logging as `name`, metrics on the process's port (run.metrics_port),
    then `build().run()` until it returns or the process is told to stop.
    The built object has `.metrics` (a RoleMetrics) and `.run()`; `.close()` runs at exit if present."""
    from common.logs import setup_logging

    setup_logging(name)
    exit_on_sigterm()
    HEARTBEAT.start(run.heartbeat_path)  # the role beats from its work loop (common/heartbeat.py)
    process = build()
    process.metrics.serve(run.metrics.host, run.metrics_port)
    try:
        process.run()
    except (KeyboardInterrupt, SystemExit):
        log.info("%s stopping", name)
    finally:
        if hasattr(process, "close"):
            process.close()
