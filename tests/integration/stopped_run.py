"""A pipeline that a test run is stopped in the middle of: run by test_stopped_run.py in a pytest
of its own, which it then stops with SIGTERM. Not collected by the suite (its name does not start
with test_); a pytest given the file by name runs it.

The fixture starts the whole pipeline as the end-to-end modules do (empo2-run, the e2e profile,
every role its own process) and hands the test a run whose roles are up; the test waits until the
policy server has generated, writes the run's mark (tests/conftest.py) and directory to the file
named by STOPPED_RUN_READY_ENV, and waits to be stopped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from testing.harness import LaunchedRun
from tests.helpers import REPO, TEST_RUN_ENV

STOPPED_RUN_READY_ENV = "EMPO2_STOPPED_RUN_READY"
TIMEOUT_S = 900
OVERRIDES = [
    "profile=e2e",
    "endpoints.policy_servers=[tcp://127.0.0.1:13550]",
    "endpoints.replay_buffer=tcp://127.0.0.1:13560",
    "endpoints.memory_service=tcp://127.0.0.1:13570",
    "metrics.base_port=14100",
    f"launch.timeout_s={TIMEOUT_S}",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = LaunchedRun(OVERRIDES, tmp_path_factory.mktemp("stopped"), TIMEOUT_S, cwd=REPO)
    try:
        run.wait_until_up()
        yield run
    finally:
        run.stop()


def test_the_pipeline_generates_until_the_test_run_is_stopped(run):
    run.wait_for(
        "generation", lambda: run.metric("policy_server", "empo2_policy_server_generated_tokens_total"), poll_s=2
    )
    ready = {"mark": os.environ[TEST_RUN_ENV].split()[-1], "run_dir": str(run.run_dir)}
    Path(os.environ[STOPPED_RUN_READY_ENV]).write_text(json.dumps(ready))
    run.wait_for("the test run's stop", lambda: False)
