"""The launcher's progress line (deploy/launch.py): integer counts (Prometheus reports floats) and
an ETA from the learner's step rate as the launcher sees it."""

from __future__ import annotations

from deploy import launch
from deploy.launch import Launcher, StepRate, duration, progress_line
from pipeline.config import load_config


def test_counts_are_integers_in_the_progress_and_the_summary(monkeypatch, tmp_path):
    values = {
        "empo2_learner_steps_total": 1.0,
        "empo2_replay_buffer_trajectories_accepted_total": 9.0,
        "empo2_memory_service_entries": 12.0,
        "empo2_policy_server_ready": 1.0,
        "empo2_policy_server_generated_tokens_total": 480.0,
    }
    monkeypatch.setattr(launch, "scrape", lambda host, port: dict(values))
    launcher = Launcher(load_config([f"run_dir={tmp_path}"]), [], roles=[])  # started nothing: no children
    p = launcher.progress()
    assert p["episodes"] == 9 and p["server_versions"] == [-1]  # no version metric yet
    assert all(isinstance(v, int) for v in p.values() if not isinstance(v, list))
    line = progress_line(30.0, p, 2, None, 0)
    assert "episodes 9 " in line and "versions [-1] " in line and "learner steps 1/2 (ETA --)" in line
    assert ".0" not in line


def test_the_eta_follows_the_learners_rate_after_its_first_step():
    rate = StepRate()
    assert rate.eta_s(0.0, 0, 10) is None  # start-up: no step yet
    assert rate.eta_s(300.0, 1, 10) is None  # the first step: its time includes the start-up
    assert rate.eta_s(360.0, 3, 10) == 7 * 30.0  # 2 steps in 60 s: 7 left
    assert rate.eta_s(400.0, 10, 10) == 0.0
    resumed = StepRate()  # a resumed run counts from its own steps
    assert resumed.eta_s(0.0, 40, 50) is None and resumed.eta_s(10.0, 41, 50) is None
    assert resumed.eta_s(30.0, 43, 50) == 7 * 10.0
    assert [duration(s) for s in (45, 750, 14700)] == ["45s", "12m30s", "4h05m"]
    line = progress_line(
        12.0,
        {
            "servers_ready": 1,
            "server_versions": [3],
            "episodes": 40,
            "learner_steps": 3,
            "memory_entries": 0,
            "generated_tokens": 5,
        },
        10,
        210.0,
        1,
    )
    assert "learner steps 3/10 (ETA 3m30s)" in line and line.endswith("restarts 1")
