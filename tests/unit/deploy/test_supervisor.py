"""The supervising launcher (deploy/launch.py) with stand-in role processes (role_stub.py): a
crashed role comes back after its backoff, every restart is counted (state file, metric, summary),
a role past its restart budget stops the run naming it, the learner's exit 0 ends it, a role whose
heartbeat stops is killed and restarted with reason hung, and the state and scrape-target files
follow the processes (deploy/run_state.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import pytest

from common.heartbeat import heartbeat_path
from deploy.launch import STOPPING, Launcher
from deploy.monitor import scrape
from deploy.run_state import TARGETS_FILE, kill_role, read_state, wait_for_role
from pipeline.config import load_config
from pipeline.roles import RoleSpec

STUB = "tests.unit.deploy.role_stub"
BASE = 31100  # metrics.base_port of these tests: the launcher serves on 31202


def _launcher(tmp_path, roles, *overrides) -> Launcher:
    cfg = load_config(
        [
            f"run_dir={tmp_path}",
            f"metrics.base_port={BASE}",
            "launch.backoff_s=0.2",
            "launch.stop_grace_s=5",
            *overrides,
        ]
    )
    return Launcher(cfg, [], roles=roles, publish=True)


def _supervise_until(launcher: Launcher, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outcome = launcher.supervise(time.monotonic())
        if outcome is not None:
            return outcome
        time.sleep(0.05)
    return "still running"


@pytest.fixture
def started():
    launchers: list[Launcher] = []
    yield launchers.append
    for launcher in launchers:
        launcher.stop()


def test_a_crashed_role_is_restarted_and_the_learner_exit_ends_the_run(tmp_path, started):
    roles = [
        RoleSpec("replay_buffer", [STUB], "replay_buffer", 0, args=(f"flaky:{tmp_path / 'crashed'}:7",)),
        RoleSpec("learner", [STUB], "learner", 0, ends_run=True, args=(f"done-after:{tmp_path / 'learner-ran'}",)),
    ]
    launcher = _launcher(tmp_path, roles)
    started(launcher)
    launcher.start()
    buffer = wait_for_role(
        tmp_path,
        "replay_buffer",
        restarts=1,
        timeout_s=30,
        alive=lambda: _supervise_until(launcher, 0.2) == "still running",
    )
    assert buffer["last_exit"] == 7 and buffer["up"] and buffer["restart_reasons"] == {"exit": 1}
    assert launcher.restarts() == {"replay_buffer": 1, "learner": 0}
    samples = scrape("127.0.0.1", BASE + 102)
    assert samples['empo2_launch_restarts_total{reason="exit",role="replay_buffer"}'] == 1
    assert samples['empo2_launch_last_exit_code{role="replay_buffer"}'] == 7
    assert samples['empo2_launch_role_up{role="learner"}'] == 1

    # a learner killed is restarted too; its next run ends the run
    kill_role(tmp_path, "learner", signal.SIGKILL)
    assert _supervise_until(launcher, 30) == "done"
    assert launcher.restarts()["learner"] == 1
    assert read_state(tmp_path)["roles"]["learner"]["last_exit"] == -signal.SIGKILL

    # the stop records each role's exit status: the learner's own 0, the buffer stopped by SIGTERM
    launcher.stop()
    roles = read_state(tmp_path)["roles"]
    assert roles["learner"]["exit"] == 0 and roles["replay_buffer"]["exit"] == -signal.SIGTERM  # the stub's default
    assert not roles["learner"]["up"] and not roles["replay_buffer"]["up"]
    # the stop is marked in the log of each role it stopped (what follows is that role's stop)
    assert STOPPING in (tmp_path / "logs" / "replay_buffer.log").read_text()
    assert STOPPING not in (tmp_path / "logs" / "learner.log").read_text()  # it had ended by itself


def test_a_role_past_its_restart_budget_stops_the_run(tmp_path, started, capsys):
    roles = [
        RoleSpec("env_actor0", [STUB], "env_actor", 0, args=("exit:3",)),
        RoleSpec("learner", [STUB], "learner", 0, args=("sleep",)),
    ]
    launcher = _launcher(tmp_path, roles, "launch.restart_budget=2", "launch.backoff_max_s=0.4")
    started(launcher)
    launcher.start()
    outcome = _supervise_until(launcher, 30)
    assert outcome.startswith("failed: env_actor0 exited with 3; restart budget spent (2 restarts"), outcome
    out = capsys.readouterr().out
    assert "restarting in 0.2s (restart 1" in out and "restarting in 0.4s (restart 2" in out  # doubling, capped
    assert out.count("restarted env_actor0") == 2


def test_a_role_whose_heartbeat_stops_is_killed_and_restarted_as_hung(tmp_path, started, capsys):
    """launch.hang_timeout_s: a role that beats and then stops (alive, never exits: as if SIGSTOPped
    or stuck) is killed and restarted with reason hung; one that keeps beating is left alone; one
    that never beats has max(hang_timeout_s, startup_timeout_s) from its start; a role without a
    heartbeat (the evaluator) is never taken for hung."""
    beats = {name: heartbeat_path(tmp_path, name) for name in ("env_actor0", "env_actor1")}
    roles = [
        RoleSpec("env_actor0", [STUB], "env_actor", 0, args=(f"beat:{beats['env_actor0']}:0.5",), heartbeat=True),
        RoleSpec("env_actor1", [STUB], "env_actor", 1, args=(f"beat:{beats['env_actor1']}",), heartbeat=True),
        RoleSpec("memory_service", [STUB], "memory_service", 0, args=("sleep",), heartbeat=True),
        RoleSpec("learner", [STUB], "learner", 0, args=("sleep",)),  # heartbeat=False
    ]
    launcher = _launcher(
        tmp_path,
        roles,
        "launch.hang_timeout_s=2",
        "startup_timeout_s=5",
        # the hang limit must exceed the waits the roles retry after (pipeline/config.py)
        "env_actor.generate_timeout_s=1",
        "env_actor.buffer_timeout_s=1",
        "learner.push_timeout_s=1",
    )
    started(launcher)
    launcher.start()
    alive = lambda: _supervise_until(launcher, 0.2) == "still running"  # noqa: E731
    hung = wait_for_role(tmp_path, "env_actor0", restarts=1, timeout_s=30, alive=alive)
    assert hung["restart_reasons"] == {"hung": 1} and hung["last_exit"] == -signal.SIGKILL and hung["up"]
    silent = wait_for_role(tmp_path, "memory_service", restarts=1, timeout_s=30, alive=alive)
    assert silent["restart_reasons"] == {"hung": 1}
    assert launcher.restarts()["env_actor1"] == 0 and launcher.restarts()["learner"] == 0
    samples = scrape("127.0.0.1", BASE + 102)  # env_actor0 hangs again after each restart
    assert samples['empo2_launch_restarts_total{reason="hung",role="env_actor0"}'] == launcher.restarts()["env_actor0"]
    out = capsys.readouterr().out
    assert "env_actor0 (pid" in out and "restarted env_actor0" in out and "reason hung" in out
    first_beat = re.search(r"env_actor0 \(pid \d+\) hung: no progress for (\d+)s \(launch.hang_timeout_s=2\)", out)
    never_beat = re.search(r"memory_service \(pid \d+\) hung: no progress for (\d+)s", out)
    assert first_beat and never_beat, out
    assert int(never_beat[1]) >= 5  # its start-up allowance, not hang_timeout_s


def test_hang_detection_is_off_at_zero(tmp_path, started):
    roles = [RoleSpec("memory_service", [STUB], "memory_service", 0, args=("sleep",), heartbeat=True)]
    launcher = _launcher(tmp_path, roles, "launch.hang_timeout_s=0", "startup_timeout_s=0.5")
    started(launcher)
    launcher.start()
    assert _supervise_until(launcher, 2) == "still running"
    assert launcher.restarts() == {"memory_service": 0}


def test_the_scrape_targets_follow_the_processes(tmp_path, started):
    roles = [RoleSpec(f"env_actor{j}", [STUB], "env_actor", j, args=("sleep",)) for j in range(2)]
    launcher = _launcher(tmp_path, roles)
    started(launcher)
    launcher.start()
    targets = json.loads((tmp_path / TARGETS_FILE).read_text())
    assert {(t["labels"].get("role"), t["labels"]["job"], t["targets"][0]) for t in targets} == {
        ("env_actor0", "empo2_env_actor", f"127.0.0.1:{BASE + 300}"),
        ("env_actor1", "empo2_env_actor", f"127.0.0.1:{BASE + 301}"),
        (None, "empo2_launch", f"127.0.0.1:{BASE + 102}"),  # its metrics have their own `role` label
    }
    pid = kill_role(tmp_path, "env_actor1")
    back = wait_for_role(
        tmp_path, "env_actor1", 1, 30, alive=lambda: _supervise_until(launcher, 0.2) == "still running"
    )
    assert back["pid"] != pid
    with pytest.raises(LookupError):
        kill_role(tmp_path, "env_actor7")


def test_attach_grows_and_shrinks_the_env_actors_of_a_running_launcher(tmp_path, started, monkeypatch, capsys):
    """`empo2-run --attach RUN_DIR launch.num_env_actors=N` against a supervising launcher: 1 -> 3
    starts two actors at once, 3 -> 1 stops the two highest gracefully (not restarted), the state
    and the scrape targets follow."""
    import deploy.launch

    monkeypatch.setattr(
        deploy.launch, "env_actor_spec", lambda j: RoleSpec(f"env_actor{j}", [STUB], "env_actor", j, args=("sleep",))
    )
    roles = [deploy.launch.env_actor_spec(0), RoleSpec("learner", [STUB], "learner", 0, args=("sleep",))]
    launcher = _launcher(tmp_path, roles)
    started(launcher)
    launcher.start()
    stop = threading.Event()

    def supervise():  # the launcher's wait() loop, in a thread while --attach waits in this one
        while not stop.is_set():
            launcher.follow_scale_request(time.monotonic())
            assert launcher.supervise(time.monotonic()) is None
            time.sleep(0.05)

    loop = threading.Thread(target=supervise)
    loop.start()
    try:
        assert deploy.launch.attach_main([str(tmp_path), "launch.num_env_actors=3"]) == 0
        roles = read_state(tmp_path)["roles"]
        assert sorted(n for n in roles if n.startswith("env_actor")) == ["env_actor0", "env_actor1", "env_actor2"]
        targets = {t["labels"].get("role") for t in json.loads((tmp_path / TARGETS_FILE).read_text())}
        assert {"env_actor1", "env_actor2"} <= targets
        pids = {n: r["pid"] for n, r in roles.items()}

        assert deploy.launch.attach_main([str(tmp_path), "launch.num_env_actors=1"]) == 0
        roles = read_state(tmp_path)["roles"]
        assert sorted(roles) == ["env_actor0", "learner"] and roles["env_actor0"]["pid"] == pids["env_actor0"]
        for gone in ("env_actor1", "env_actor2"):
            with pytest.raises(ProcessLookupError):
                os.kill(pids[gone], 0)
        assert "env_actor1" not in {t["labels"].get("role") for t in json.loads((tmp_path / TARGETS_FILE).read_text())}
    finally:
        stop.set()
        loop.join()
    assert launcher.restarts() == {"env_actor0": 0, "learner": 0}  # scaling is not a crash
    out = capsys.readouterr().out
    assert "scaling up: started env_actor2" in out and "env_actor2 stopped (exit status -15): scaled down" in out
    assert deploy.launch.attach_main([str(tmp_path), "launch.num_env_actors=0"]) == 2  # refused at load
    assert deploy.launch.attach_main([str(tmp_path / "nothing"), "launch.num_env_actors=2"]) == 2


@pytest.mark.parametrize("configured", ["", "s3cret"])
def test_a_run_without_a_configured_learner_token_gives_its_buffer_and_learner_one_of_their_own(
    tmp_path, started, configured
):
    """Only the roles the table marks (the buffer and the learner) get the run's random token, in their environment (pipeline/cli.py
    reads it into security.learner_token); a configured token is the config's, handed to nobody."""
    names = ("replay_buffer", "learner", "env_actor")
    roles = [RoleSpec(n, [STUB], n, 0, args=(f"token:{tmp_path / n}",), learner_token=n != "env_actor") for n in names]
    launcher = _launcher(tmp_path, roles, f"security.learner_token={configured}")
    started(launcher)
    launcher.start()
    deadline = time.monotonic() + 30
    while not all((tmp_path / n).exists() for n in names) and time.monotonic() < deadline:
        time.sleep(0.05)
    tokens = {n: (tmp_path / n).read_text() for n in names}
    if configured:
        assert tokens == {n: "" for n in names}
    else:
        assert len(tokens["learner"]) >= 32 and tokens["replay_buffer"] == tokens["learner"]
        assert tokens["env_actor"] == ""


def test_a_role_takes_the_handed_token_only_when_the_config_sets_none(monkeypatch, tmp_path):
    from pipeline.cli import LEARNER_TOKEN_ENV, role_config

    monkeypatch.setenv(LEARNER_TOKEN_ENV, "from-the-launcher")
    assert role_config("empo2-learner", [f"run_dir={tmp_path}"]).security.learner_token == "from-the-launcher"
    configured = role_config("empo2-learner", [f"run_dir={tmp_path}", "security.learner_token=mine"])
    assert configured.security.learner_token == "mine"
