"""`empo2-memory-tta` for real: the command starts a vLLM policy server and the memory service,
plays two trials of an unseen task in real ScienceWorld, and must show the second trial the
memories of the first; checked from its output, tta.json and the processes left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from common.config import EnvConfig
from common.process import spawn_command
from common.scienceworld import ScienceWorld
from tests.helpers import REPO

pytestmark = pytest.mark.integration
TIMEOUT_S = 900
TASK = "find-animal"


def _state(proc_dir: Path) -> str:
    """The process state letter from /proc/<pid>/stat (after the parenthesised command name)."""
    return (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[0]


def _sessions_alive(sids: list[int]) -> list[str]:
    """Processes still in any of these sessions (a started role, its vLLM workers, a JVM)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) in sids and _state(entry) != "Z":  # a zombie has ended already
                    alive.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except (ProcessLookupError, PermissionError, FileNotFoundError):
                pass  # ended while we looked
    return alive


def test_tta_two_trials_memory_grows(tmp_path):
    overrides = [
        "profile=e2e",
        f"run_dir={tmp_path}",
        "tta.trials=2",
        f"tta.tasks=[{TASK}]",
        "tta.variations=1",
        "env.max_steps=2",
    ]
    out_path = tmp_path / "tta.out"
    proc = spawn_command("empo2-memory-tta", overrides, out_path, cwd=REPO)
    try:
        rc = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the command stops what it started on its way out
        proc.wait(timeout=120)
        pytest.fail(f"no result within {TIMEOUT_S}s:\n" + out_path.read_text(errors="replace")[-6000:])
    output = out_path.read_text(errors="replace")
    print(output[-3000:])
    assert rc == 0, output[-6000:]

    env_check = ScienceWorld(EnvConfig().simplification)
    try:
        first_test_variation = env_check.test_variations(TASK)[0]
    finally:
        env_check.close()
    report = json.loads((tmp_path / "tta.json").read_text())
    [row] = report["results"]
    assert (row["task"], row["variation"]) == (TASK, first_test_variation)
    assert len(row["scores"]) == 2 and all(-100 <= s <= 100 for s in row["scores"])
    assert len(report["mean_per_trial"]) == 2
    assert re.search(rf"^{TASK}\s+{first_test_variation}\s+-?\d+\s+-?\d+$", output, re.M), "no result table printed"

    # trial 1's reflection was stored before trial 2, and trial 2 was shown its tips
    assert row["reflection_stored"][0] is True
    assert row["tips_shown"][0] == 0 and row["tips_shown"][1] > 0
    assert (tmp_path / "memory.sqlite").stat().st_size > 0

    # only the servers were started, and nothing of them (or of the command) is left running
    started = re.findall(r"started (\w+) \(pid (\d+)\)", output)
    assert [name for name, _ in started] == ["policy_server0", "memory_service"]
    assert not _sessions_alive([proc.pid, *(int(pid) for _, pid in started)])
