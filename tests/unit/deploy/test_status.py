"""empo2-status (deploy/status.py) against real metrics endpoints (the roles' metric classes served
by prometheus_client) and a launcher state file: up/down, restarts, rates from two scrapes, learner
step time, the last error of a log, and the same as JSON."""

from __future__ import annotations

import json
import threading
import time

from common.metrics import EnvActorMetrics, LearnerMetrics, ReplayBufferMetrics
from deploy.run_state import STATE_FILE, write_json
from deploy.status import main, status

BASE = 31500  # ports of this test


def test_status_from_the_roles_own_metrics(tmp_path, capsys):
    actor, buffer, learner = EnvActorMetrics(), ReplayBufferMetrics(), LearnerMetrics()
    for i, m in enumerate((actor, buffer, learner)):
        m.serve("127.0.0.1", BASE + i)
    learner.steps.inc(3)
    for _ in range(3):
        learner.step_seconds.observe(10.0)
    learner.policy_version.set(3)
    buffer.groups_ready.set(2)
    actor.errors.labels("timeout").inc(2)
    log = tmp_path / "env_actor0.log"
    log.write_text(
        "12:00:00 INFO env_actor0 episode 1\n12:00:01 ERROR env_actor0 policy server timed out\n12:00:02 INFO ok\n"
    )
    roles = [
        {
            "name": "env_actor0",
            "kind": "env_actor",
            "metrics": f"127.0.0.1:{BASE}",
            "log": str(log),
            "restarts": 2,
            "restart_reasons": {"exit": 1, "hung": 1},
            "last_exit": -9,
        },
        {"name": "replay_buffer", "kind": "replay_buffer", "metrics": f"127.0.0.1:{BASE + 1}", "log": None},
        {"name": "learner", "kind": "learner", "metrics": f"127.0.0.1:{BASE + 2}", "log": None},
        {"name": "memory_service", "kind": "memory_service", "metrics": f"127.0.0.1:{BASE + 9}", "log": None},
    ]
    done = threading.Event()

    def traffic():  # 10 env steps and 5 episodes per second while status scrapes
        while not done.is_set():
            actor.env_steps.inc(1)
            buffer.trajectories.labels("on_policy").inc(0.5)
            time.sleep(0.1)

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        report = status(roles, 1.0)
        write_json(tmp_path / STATE_FILE, {"roles": {r["name"]: r for r in roles}})
        assert main([str(tmp_path), "--json", "--interval", "0.5"]) == 0
        as_json = json.loads(capsys.readouterr().out)
        assert main([str(tmp_path), "--interval", "0.5"]) == 0
        screen = capsys.readouterr().out
    finally:
        done.set()
        thread.join()

    r = report["roles"]
    assert r["env_actor0"]["up"] and r["learner"]["up"] and not r["memory_service"]["up"]
    assert r["env_actor0"]["restarts"] == 2 and r["env_actor0"]["errors"] == {"timeout": 2.0}
    assert r["env_actor0"]["hung"] == 1 and "restarted hung 1" in screen
    assert r["env_actor0"]["last_error"].endswith("ERROR env_actor0 policy server timed out")
    assert r["learner"]["policy_version"] == 3
    assert 3 < report["rates"]["env steps/s"] < 30 and 1 < report["rates"]["episodes/s"] < 15
    assert report["rates"]["learner tokens/s"] == 0
    assert report["learner_step"] == 3 and report["seconds_per_step"] == 10.0
    assert report["buffer_groups_ready"] == 2
    assert as_json["roles"]["memory_service"]["up"] is False and "launcher state" in as_json["source"]
    assert "memory_service   DOWN" in screen and "learner step 3 (10.0 s/step)" in screen
