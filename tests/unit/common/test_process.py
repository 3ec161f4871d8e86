"""Process helpers (common/process.py): SIGTERM takes a supervisor's Ctrl-C path."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common.process import lower_cpu_priority, release_free_heap, status_mb
from tests.helpers import REPO

SUPERVISOR = """
import time
from common.process import interrupt_on_sigterm
interrupt_on_sigterm()
try:
    print("ready", flush=True)
    time.sleep(60)
    print("slept", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
finally:
    print("children stopped", flush=True)
"""


def test_sigterm_interrupts_a_supervisor_so_its_clean_up_runs():
    proc = subprocess.Popen([sys.executable, "-c", SUPERVISOR], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert out.split() == ["interrupted", "children", "stopped"]
    assert proc.returncode == 0


SHM_HOLDER = """
import mmap, os, sys, time
from multiprocessing import shared_memory
if os.fork() == 0:  # the group's helper (a vLLM engine core): creates and maps the segment
    shm = shared_memory.SharedMemory(create=True, size=4096, name=sys.argv[1])
    print("mapped", flush=True)
    time.sleep(60)
else:
    time.sleep(60)  # the role's main process
"""


def test_a_killed_roles_shared_memory_is_found_and_removed():
    """What the supervisor does after a crash: the /dev/shm files its group mapped, unlinked once
    no living process maps them (a SIGKILLed role's resource tracker cannot)."""
    from common.process import group_shm_files, signal_group, unlink_unmapped, wait_group

    name = f"empo2-test-{os.getpid()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", SHM_HOLDER, name], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout.readline().strip() == "mapped"
        found = group_shm_files(proc)
        assert f"/dev/shm/{name}" in found
        assert unlink_unmapped(found) == []  # still mapped: left alone
        proc.kill()  # the role's main process dies; its helper still runs
        signal_group(proc, signal.SIGKILL)
        assert wait_group(proc, time.monotonic() + 10)
        assert unlink_unmapped(found) == [f"/dev/shm/{name}"]
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        signal_group(proc, signal.SIGKILL)
        proc.wait()
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


def test_a_dead_processes_loky_semaphore_is_orphaned_a_living_ones_is_not(tmp_path):
    """A SIGKILLed vLLM CPU worker leaves /dev/shm/sem.loky-<its pid>-<random>, unmapped: found by
    its creator's pid being gone; a living process's is left alone."""
    from common.process import orphaned_semaphores

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid names no process (until reused, when the file is left alone)
    files = [Path(f"/dev/shm/sem.loky-{pid}-empo2test") for pid in (dead.pid, os.getpid())]
    try:
        for f in files:
            f.write_bytes(b"")
        found = orphaned_semaphores()
        assert str(files[0]) in found
        assert str(files[1]) not in found
    finally:
        for f in files:
            f.unlink(missing_ok=True)


ENGINE_LIKE = """
import multiprocessing as mp, os, sys, time
from multiprocessing import shared_memory
from common.process import ChildSharedMemory

def engine_core(names):  # creates a segment, as vLLM's engine processes do, and never unlinks it
    shm = shared_memory.SharedMemory(create=True, size=4096)
    names.put(shm.name)
    time.sleep(60)

if __name__ == "__main__":
    names = mp.get_context("spawn").Queue()
    child = mp.get_context("spawn").Process(target=engine_core, args=(names,))  # vLLM's CPU engine: spawn
    child.start()
    name = names.get(timeout=60)
    held = ChildSharedMemory.snapshot()
    print("held", held.shared_tracker, sorted(held.owners.values()) == [{f"/dev/shm/{name}"}], flush=True)
    child.terminate()  # stopped with its group: the segment stays for the resource tracker
    child.join()
    if sys.argv[1] == "release":
        print("released", held.release(timeout_s=10) == [f"/dev/shm/{name}"], flush=True)
    print("left", os.path.exists(f"/dev/shm/{name}"), flush=True)
"""


def test_shared_memory_a_child_left_is_released_without_a_leak_warning(tmp_path):
    """vLLM's engine processes, stopped, leave a SharedMemory segment that the resource tracker
    they share with the policy server unlinks at its exit, with a "leaked shared_memory objects"
    warning in the log (the control); released by the parent after they exited, it is gone and no
    warning is written (actors/policy_server/engine.py, issue 26)."""
    script = tmp_path / "engine_like.py"
    script.write_text(ENGINE_LIKE)
    runs = {}
    for mode in ("control", "release"):
        runs[mode] = subprocess.run(
            [sys.executable, str(script), mode],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    control, release = runs["control"], runs["release"]
    assert control.stdout.split() == ["held", "True", "True", "left", "True"], control.stderr
    assert "leaked shared_memory" in control.stderr  # the tracker unlinked it, and warned
    assert release.stdout.split() == ["held", "True", "True", "released", "True", "left", "False"], release.stderr
    assert "leaked" not in release.stderr and "Traceback" not in release.stderr, release.stderr


def test_release_free_heap_returns_the_holes_a_freed_step_leaves():
    """Blocks freed between blocks still in use stay resident until the heap is trimmed (what a
    learner step's activations leave); release_free_heap gives them back."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = 64 * 1024  # below glibc's mmap threshold: from the heap
    blocks = [libc.malloc(block) for _ in range(3000)]
    for b in blocks:
        ctypes.memset(b, 1, block)  # resident
    for b in blocks[::2]:
        libc.free(b)  # holes between blocks in use: free() alone keeps them
    held = status_mb()
    assert release_free_heap()
    released = held - status_mb()
    for b in blocks[1::2]:
        libc.free(b)
    assert released > 0.6 * 1500 * block / 2**20, f"{released:.0f} MB given back"


PRIORITY = """
import os
from pathlib import Path
from common.process import lower_cpu_priority
lower_cpu_priority({nice})
autogroup = Path("/proc/self/autogroup")
# empty in the kernel's default autogroup (a session that descends from init's, as in a container)
words = autogroup.read_text().split() if autogroup.exists() else []
print(os.getpriority(os.PRIO_PROCESS, 0), words[-1] if words else "-")
"""


def _priority_in_child(nice: int, new_session: bool, prefix: tuple[str, ...] = ()) -> tuple[int, str]:
    out = subprocess.run(
        [*prefix, sys.executable, "-c", PRIORITY.format(nice=nice)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        start_new_session=new_session,
    ).stdout.split()
    return int(out[0]), out[1]


def test_a_rollout_process_runs_niced_and_so_does_its_session_autogroup():
    target = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)  # above this test's own niceness, whatever runs it
    # a launched role is a session of its own: its autogroup (where the kernel has them) takes the niceness
    assert _priority_in_child(target, new_session=True) in ((target, str(target)), (target, "-"))
    # a process run from a shell (no session of its own) leaves the shell's autogroup alone
    ours = Path("/proc/self/autogroup").read_text().split() if Path("/proc/self/autogroup").exists() else []
    ours = ours[-1] if ours else "-"  # empty in the default autogroup (a container's init never made a session)
    assert _priority_in_child(target, new_session=False) == (target, ours)
    # an operator's higher niceness is kept, and 0 changes nothing
    assert _priority_in_child(0, new_session=True, prefix=("nice", "-n", "19"))[0] == 19
    assert _priority_in_child(0, new_session=True)[0] == os.getpriority(os.PRIO_PROCESS, 0)


def test_lower_cpu_priority_never_raises_the_priority():
    before = os.getpriority(os.PRIO_PROCESS, 0)
    lower_cpu_priority(before)  # no change asked: nothing to do, no permission needed
    assert os.getpriority(os.PRIO_PROCESS, 0) == before


def test_role_logs_get_no_progress_bars(tmp_path):
    """A role's environment turns tqdm off (transformers' weight-loading bars filled the logs with
    carriage-return lines), whatever the operator's shell says."""
    from common.process import role_env

    env = role_env()
    assert env["TQDM_DISABLE"] == "1" and env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    code = "from tqdm import tqdm\nfor _ in tqdm(range(3)): pass\n"
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "it/s" not in shown.stderr
