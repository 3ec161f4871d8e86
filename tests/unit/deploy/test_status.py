"""empo2-status (deploy/status.py) against real metrics endpoints (the roles' metric classes served
by prometheus_client) and a launcher state file: up/down, restarts, rates from two scrapes, learner
step time, the last error of a log, and the same as JSON; on a run that has ended, finished, with
its outcome, exit status, final version, summary and each role's exit status (issue 26)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from common.metrics import EnvActorMetrics, LearnerMetrics, ReplayBufferMetrics
from deploy.run_state import STATE_FILE, SUMMARY_FILE, mark_finished, not_a_run, write_json
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


SUMMARY = {
    "outcome": "done",
    "wall_seconds": 191.9,
    "learner_steps": 2,
    "policy_version": 2,
    "server_versions_at_end": [2.0],
    "episodes": 12.0,
    "mean_episode_score": -17.875,
    "final_checkpoint": "runs/x/checkpoints/step_000002",
}


def _ended_run(tmp_path, launcher_pid: int) -> None:
    """A run directory as the launcher leaves it: state (each role's exit at the stop), summary,
    clean logs (what a clean stop writes last)."""
    roles = {}
    for i, name in enumerate(("policy_server0", "replay_buffer", "learner")):
        log = tmp_path / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"12:00:00 {name} INFO {name}: stopping\n")
        roles[name] = {"name": name, "kind": name.rstrip("0"), "metrics": f"127.0.0.1:{BASE + 20 + i}"}
        roles[name] |= {"log": str(log), "restarts": 0, "last_exit": None, "exit": 0, "up": False}
    write_json(tmp_path / STATE_FILE, {"launcher_pid": launcher_pid, "roles": roles})
    (tmp_path / SUMMARY_FILE).write_text(json.dumps(SUMMARY))


def _ended_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_status_of_a_finished_run_says_finished_with_its_exit_status_version_and_summary(tmp_path, capsys):
    _ended_run(tmp_path, _ended_pid())
    mark_finished(tmp_path, "done", 0, 2)
    assert main([str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["finished"]["outcome"] == "done" and report["finished"]["exit_status"] == 0
    assert report["finished"]["policy_version"] == 2 and report["summary"] == SUMMARY
    assert {r["exit"] for r in report["roles"].values()} == {0}
    assert not [r for r in report["roles"].values() if r["up"] or r["last_error"]]
    assert main([str(tmp_path)]) == 0
    screen = capsys.readouterr().out
    assert "run finished: done, exit status 0" in screen and "final policy version 2" in screen
    assert "episodes: 12.0" in screen and "mean episode score: -17.875" in screen
    assert "DOWN" not in screen and "Traceback" not in screen
    assert "replay_buffer    stopped" in screen

    # a failed run says so, with the launcher's exit status
    mark_finished(tmp_path, "failed: learner exited with 1; restart budget spent", 1, None)
    assert main([str(tmp_path)]) == 0
    assert "run finished: failed: learner exited with 1; restart budget spent, exit status 1" in capsys.readouterr().out


def test_a_run_whose_launcher_is_gone_with_a_summary_counts_as_finished_a_running_one_does_not(tmp_path, capsys):
    """An older launcher's run (no "finished" in its state) has ended once its launcher is gone and
    its summary is there; a live launcher's run dir that holds an earlier run's summary (a resumed
    run) is still running: status scrapes its roles."""
    _ended_run(tmp_path, _ended_pid())
    assert main([str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["finished"]["outcome"] == "done" and report["finished"]["exit_status"] == 0

    _ended_run(tmp_path, os.getpid())  # this process stands for a live launcher
    assert main([str(tmp_path), "--json", "--interval", "0.1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "finished" not in report and report["roles"]["learner"]["up"] is False


def test_status_refuses_a_run_dir_that_is_not_a_run(tmp_path, capsys):
    """A RUN_DIR that does not exist, is a file, or holds none of a run's files is refused in one
    line with exit status 2, not shown as every role DOWN on the default ports (issue 42)."""
    (tmp_path / "file").write_text("")
    (tmp_path / "empty").mkdir()
    for run_dir, said in (("missing", "does not exist"), ("file", "is not a directory"), ("empty", "is not a run")):
        assert main([str(tmp_path / run_dir), "--interval", "0"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1 and err.startswith("empo2-status: "), err
        assert f"{tmp_path / run_dir} {said}" in err, err
    assert "launch/state.json, summary.json, heartbeats/" in err

    # what a run writes first makes it one: the launcher's state, a summary, the roles' heartbeats
    for marker in (STATE_FILE, SUMMARY_FILE, "heartbeats"):
        run = tmp_path / f"run_{str(marker).replace('/', '_')}"
        (run / marker).parent.mkdir(parents=True)
        (run / marker).mkdir() if marker == "heartbeats" else (run / marker).write_text("{}")
        assert not_a_run(run) is None, marker
    # roles under systemd (no launcher state): their heartbeats make it a run, shown from the configured ports
    assert main([str(tmp_path / "run_heartbeats"), "--json", "--interval", "0"]) == 0
    assert "configured ports" in json.loads(capsys.readouterr().out)["source"]


def test_status_names_the_starving_stage_from_the_buffers_leases(capsys):
    """Issue 38: the buffer's open groups wait for a slot leased to an env actor that is down and has
    not renewed it: the status says so, naming the process; slots of live renewing actors are no stall."""
    from deploy.status import pipeline_waits, render

    actor0, buffer = EnvActorMetrics(), ReplayBufferMetrics()
    for i, m in enumerate((actor0, buffer)):
        m.serve("127.0.0.1", BASE + 30 + i)
    now = time.time()
    buffer.groups_open.set(1)
    buffer.open_slots.labels("actor0").set(2)
    buffer.lease_renewed_at.labels("actor0").set(now - 5)
    buffer.open_slots.labels("actor1.1").set(1)  # env_actor1's second env
    buffer.lease_renewed_at.labels("actor1.1").set(now - 95)
    roles = [
        {"name": "env_actor0", "kind": "env_actor", "metrics": f"127.0.0.1:{BASE + 30}", "log": None},
        {"name": "env_actor1", "kind": "env_actor", "metrics": f"127.0.0.1:{BASE + 39}", "log": None},  # killed
        {"name": "replay_buffer", "kind": "replay_buffer", "metrics": f"127.0.0.1:{BASE + 31}", "log": None},
    ]
    report = status(roles, 0.1)
    waits = report["pipeline"]
    assert waits["groups_open"] == 1
    assert waits["slots"]["actor0"]["process"] == "env_actor0" and waits["slots"]["actor1.1"]["slots"] == 1
    assert waits["stall"].startswith("buffer waiting for 1 slot leased to env_actor1 (env_actor1 is down, lease last")
    assert "env_actor0" not in waits["stall"]
    screen = render(report, "test")
    assert "open groups 1: unfilled slots 2 leased to env_actor0, 1 leased to env_actor1" in screen
    assert "STALL: buffer waiting for 1 slot leased to env_actor1" in screen
    # every actor renewing and up: no stall; free slots and no env actor up: a stall
    renewing = {'empo2_replay_buffer_open_slots{holder="actor0"}': 1.0}
    renewing['empo2_replay_buffer_lease_renewed_at_seconds{holder="actor0"}'] = now - 10
    assert pipeline_waits(renewing, {"env_actor0": True}, now)["stall"] is None
    free = {'empo2_replay_buffer_open_slots{holder="none"}': 2.0, "empo2_replay_buffer_groups_ready": 0.0}
    assert pipeline_waits(free, {"env_actor0": False}, now)["stall"] == (
        "buffer waiting for 2 free slots and no env actor up; 0 groups ready for the learner"
    )
    assert pipeline_waits(free, {"env_actor0": True}, now)["stall"] is None
    assert pipeline_waits({}, {}, now) == {"slots": {}, "stall": None}
