"""What a running launcher publishes in its run directory, and the small API built on it.

    <run_dir>/launch/state.json       every supervised role: pid, up, restarts, last exit, metrics
                                      target, log file (rewritten on every start, exit and restart);
                                      once the run has ended, each role's exit status at the stop and
                                      "finished": outcome, exit status, final version, end time
    <run_dir>/prometheus/targets.json Prometheus file-based service discovery: one target per role
                                      the launcher runs (and the launcher itself), so a scrape
                                      follows the processes without editing a file

Both files are written atomically (write + rename): a reader never sees half a file. Tests,
`empo2-status` and the fault-matrix checks read them: kill_role() sends a signal to one role's
process the way a crash would (its leader only), wait_for_role() waits for the supervisor to have
brought it back.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from common.heartbeat import HEARTBEAT_DIR
from common.process import alive

STATE_FILE = Path("launch") / "state.json"
SCALE_FILE = Path("launch") / "scale.json"  # {"num_env_actors": N}: empo2-run --attach asks, the launcher applies
TARGETS_FILE = Path("prometheus") / "targets.json"


def write_json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def read_state(run_dir: str | Path) -> dict:
    """The launcher's state: {"launcher_pid", "metrics", "roles": {name: {...}}}; {} before it wrote one."""
    try:
        return json.loads((Path(run_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}


SUMMARY_FILE = "summary.json"  # the launcher's summary of a run that ended (deploy/launch.py main)


def mark_finished(run_dir: str | Path, outcome: str, exit_status: int, policy_version: int | None) -> None:
    """Record in the state that the run has ended: its outcome ("done", "failed: ..."), the
    launcher's exit status and the final policy version (the summary holds the rest)."""
    state = read_state(run_dir)
    state["finished"] = {
        "outcome": outcome,
        "exit_status": exit_status,
        "policy_version": policy_version,
        "at": time.time(),
        "summary": str(Path(run_dir) / SUMMARY_FILE),
    }
    write_json(Path(run_dir) / STATE_FILE, state)


def read_finished(run_dir: str | Path, state: dict | None = None) -> dict | None:
    """How the run ended (mark_finished) with its summary under "summary_data"; None while it runs.
    A run whose launcher ended before it recorded that (an older launcher, or one killed) counts as
    ended once the launcher is gone and a summary is there."""
    state = read_state(run_dir) if state is None else state
    finished = state.get("finished")
    summary_path = Path(run_dir) / SUMMARY_FILE
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        summary = None
    if finished is None:
        launcher = state.get("launcher_pid")
        if summary is None or (launcher and alive(launcher)):
            return None
        finished = {
            "outcome": summary.get("outcome"),
            "exit_status": 0 if summary.get("outcome") == "done" else 1,  # as the launcher exits
            "policy_version": summary.get("policy_version"),
            "at": summary_path.stat().st_mtime,
            "summary": str(summary_path),
        }
    return {**finished, "summary_data": summary or {}}


def scrape_targets(roles: list[dict], launcher_target: str) -> list[dict]:
    """File-SD entries: job empo2_<role kind> (as the static prometheus.yml names them), label
    `role` the process's name (env_actor1), plus the launcher's own endpoint. The launcher's
    target has no `role` label: its metrics carry one (the role they count), which a target
    label would rename to exported_role."""
    entries = [{"targets": [r["metrics"]], "labels": {"job": f"empo2_{r['kind']}", "role": r["name"]}} for r in roles]
    entries.append({"targets": [launcher_target], "labels": {"job": "empo2_launch"}})
    return entries


def kill_role(run_dir: str | Path, name: str, sig: int = signal.SIGKILL) -> int:
    """Signal the running process of role `name` (its main process only, as a crash would leave
    its helpers behind; the supervisor clears them); returns the pid signalled."""
    role = read_state(run_dir).get("roles", {}).get(name)
    if not role or not role.get("up"):
        raise LookupError(f"{name} is not running in {run_dir}: {role}")
    os.kill(role["pid"], sig)
    return role["pid"]


def wait_for_role(run_dir: str | Path, name: str, restarts: int, timeout_s: float, alive=lambda: True) -> dict:
    """Wait until role `name` has been restarted at least `restarts` times and runs again; its
    state entry. `alive()` false (e.g. the launcher ended) or the timeout raises with the state."""
    deadline = time.monotonic() + timeout_s
    while True:
        role = read_state(run_dir).get("roles", {}).get(name, {})
        if role.get("restarts", 0) >= restarts and role.get("up"):
            return role
        if not alive() or time.monotonic() > deadline:
            raise TimeoutError(f"{name} not back after {restarts} restarts: {role}")
        time.sleep(0.5)


def newest_run(runs: Path = Path("runs")) -> Path | None:
    """The run directory under `runs` whose launcher wrote its state last (conf/pipeline.yaml
    names a new one per run), or None."""
    states = sorted(runs.glob(f"*/{STATE_FILE}"), key=lambda p: p.stat().st_mtime)
    return states[-1].parent.parent if states else None


def not_a_run(run_dir: str | Path) -> str | None:
    """Why `run_dir` is not a run's directory, in one line; None when it is one: it holds what a run
    writes first, the launcher's state (launch/state.json), a run's summary (summary.json) or the
    roles' heartbeats (heartbeats/, made by every role at its start, under empo2-run or systemd)."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        return f"{run_dir} does not exist"
    if not run_dir.is_dir():
        return f"{run_dir} is not a directory"
    markers = (STATE_FILE, Path(SUMMARY_FILE), Path(HEARTBEAT_DIR))
    if any((run_dir / marker).exists() for marker in markers):
        return None
    names = ", ".join(f"{m}/" if m.name == HEARTBEAT_DIR else str(m) for m in markers)
    return f"{run_dir} is not a run directory: it has none of {names} (a run's launcher or roles write them)"


def request_scale(run_dir: str | Path, num_env_actors: int) -> None:
    write_json(Path(run_dir) / SCALE_FILE, {"num_env_actors": num_env_actors})


def read_scale_request(run_dir: str | Path) -> int | None:
    try:
        return int(json.loads((Path(run_dir) / SCALE_FILE).read_text())["num_env_actors"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
