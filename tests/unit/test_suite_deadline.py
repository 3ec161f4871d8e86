"""The suite's per-phase deadline (tests/conftest.py): a test hung where the CI's once was, in zmq's
Context.term() waiting for a socket left open, fails at EMPO2_TEST_TIMEOUT_S with the stacks of
its threads, and the run goes on to its next test."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import zmq

from tests.helpers import REPO

PROBE = "EMPO2_DEADLINE_PROBE"


@pytest.mark.skipif(not os.environ.get(PROBE), reason="the hung test that the test below runs in its own pytest")
def test_probe_hangs_in_context_term():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)  # never closed: term() waits for it
    ctx.term()
    sock.close()


@pytest.mark.skipif(not os.environ.get(PROBE), reason="the test after the hung one, in the same pytest")
def test_probe_after_the_hang():
    pass


def test_a_hung_phase_fails_at_the_deadline_with_the_stacks_and_the_run_goes_on():
    env = {**os.environ, PROBE: "1", "EMPO2_TEST_TIMEOUT_S": "2"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", __file__ + "::test_probe_hangs_in_context_term",
         __file__ + "::test_probe_after_the_hang"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout, run.stdout
    assert "test_probe_hangs_in_context_term: call ran past 2 s (EMPO2_TEST_TIMEOUT_S)" in run.stdout, run.stdout
    # the threads' stacks, in the failed test's captured stderr
    assert "Captured stderr call" in run.stdout and "in test_probe_hangs_in_context_term" in run.stdout, run.stdout
