"""Process helpers (common/process.py): SIGTERM takes a supervisor's Ctrl-C path."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

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
