"""A test run stopped with SIGTERM (as `timeout` stops one) leaves nothing running: a pytest of
its own runs stopped_run.py, whose fixture starts the whole pipeline (the launcher, a vLLM policy
server with its engine, ScienceWorld JVMs, the memory service, the replay buffer, the learner);
once it generates, that pytest gets SIGTERM. It must end as interrupted, its fixture's finalizer
having stopped the pipeline (tests/conftest.py: SIGTERM takes the Ctrl-C path, not the sweep of
left processes), with no process of that run left and none of the /dev/shm files they mapped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.process import shm_files, stop_group
from tests.helpers import REPO, marked_processes, stop_marked_processes
from tests.integration.stopped_run import STOPPED_RUN_READY_ENV, TIMEOUT_S

pytestmark = pytest.mark.e2e
STOPPED_RUN = Path(__file__).with_name("stopped_run.py")


def test_a_test_run_stopped_with_sigterm_stops_the_pipeline_it_started(tmp_path):
    ready, out = tmp_path / "ready.json", tmp_path / "pytest.out"
    with open(out, "wb") as log:
        inner = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(STOPPED_RUN)],
            cwd=REPO,
            env={**os.environ, STOPPED_RUN_READY_ENV: str(ready)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    mark = None
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not ready.exists():
            assert inner.poll() is None, out.read_text(errors="replace")[-5000:]
            assert time.monotonic() < deadline, out.read_text(errors="replace")[-5000:]
            time.sleep(1)
        mark = json.loads(ready.read_text())["mark"]
        running = marked_processes(mark)
        commands = " ".join(running.values())
        assert "empo2-run" in commands and "empo2-policy-server" in commands and "java" in commands, running
        mapped = shm_files(running)

        inner.send_signal(signal.SIGTERM)
        rc = inner.wait(timeout=300)
        output = out.read_text(errors="replace")
        assert rc == pytest.ExitCode.INTERRUPTED, output[-5000:]
        assert "left running" not in output, output[-5000:]  # the finalizer stopped it, not the sweep
        assert not marked_processes(mark), output[-5000:]
        assert not [path for path in mapped if os.path.exists(path)]
    finally:
        if inner.poll() is None:
            stop_group(inner, grace_s=30)
        if mark is not None:
            stop_marked_processes(mark)
