"""A policy server restarted into a run starts at the run's newest weights, with the default weight
sync (weight_sync.method=zmq, learner.checkpoint_every=0: no file holds them): the whole pipeline
on the e2e profile, its one policy server killed with SIGKILL once it serves version 3. The launcher
restarts it; its engine loads the base model, it reads the run's newest version
(protocol/newest_version.py) and answers every generation not_ready until the learner, waiting for
a batch, sees it behind (its Pong) and pushes the current weights to it alone (catch-up), or its next
step's push reaches it (sent again while the server answers not_ready, never failing). Its first
generation after the restart is at the newest version, never the base model's, and training goes on
to its step target with the episodes the restarted server plays. With the default timeouts (300 s):
a generation or a push in flight on the killed server is given up once the restarted one answers a
probe (protocol/transport.py, RequestLost), not at its timeout.
"""

from __future__ import annotations

import json
import re
import signal

import pytest

from deploy.run_state import kill_role, read_state, wait_for_role
from testing.harness import LaunchedRun
from tests.helpers import REPO

pytestmark = pytest.mark.e2e
BASE = 22100  # metrics.base_port: server 22100, buffer 22200, memory 22201, launcher 22202, learner 22300, ...
TOTAL_STEPS = 6  # 3 before the kill; up to two complete groups may wait then, so the 6th needs the restarted server
OVERRIDES = [
    "profile=e2e",
    "endpoints.policy_servers=[tcp://127.0.0.1:21550]",
    "endpoints.replay_buffer=tcp://127.0.0.1:21560",
    "endpoints.memory_service=tcp://127.0.0.1:21570",
    f"metrics.base_port={BASE}",
    f"learner.total_steps={TOTAL_STEPS}",
    "launch.backoff_s=2",
    "launch.progress_every_s=15",
]
TIMEOUT_S = 1200


def test_a_restarted_policy_server_serves_the_newest_version_first(tmp_path):
    run = LaunchedRun(OVERRIDES, tmp_path / "run", TIMEOUT_S, cwd=REPO)
    assert run.cfg.weight_sync.method == "zmq" and run.cfg.learner.checkpoint_every == 0  # the defaults
    server_log = run.run_dir / "logs" / "policy_server0.log"
    try:
        run.wait_for(
            "policy version 3 on the server",
            lambda: run.metric("policy_server", "empo2_policy_server_policy_version") >= 3,
            poll_s=1,
        )
        restarts = read_state(run.run_dir)["roles"]["policy_server0"]["restarts"]
        offset = server_log.stat().st_size  # what the restarted server writes comes after
        kill_role(run.run_dir, "policy_server0", signal.SIGKILL)
        wait_for_role(run.run_dir, "policy_server0", restarts + 1, TIMEOUT_S, run.alive)

        def after_restart() -> str:
            with open(server_log, errors="replace") as f:
                f.seek(offset)
                return f.read()

        first = run.wait_for(
            "the restarted server's first generation",
            lambda: re.search(r"first generation since start, at policy version (\d+)", after_restart()),
            poll_s=2,
        )
        restarted = after_restart()
        awaited = re.search(r"the run is at policy version (\d+): no generation until", restarted)
        assert awaited, restarted[-3000:]  # it found the run ahead of the base model and waited
        assert int(first.group(1)) >= int(awaited.group(1)) >= 3, restarted[-3000:]
        assert "loaded policy version 0" in restarted  # the engine itself starts from the base model

        assert run.wait() == 0, run.tail()
        summary = json.loads((run.run_dir / "summary.json").read_text())
        assert summary["outcome"] == "done" and summary["restarts"]["policy_server0"] == 1, summary
        assert summary["restarts"]["learner"] == 0  # the push to the restarting server waited, never failed
        assert summary["server_versions_at_end"] == [TOTAL_STEPS]
    finally:
        run.stop(grace_s=120)
