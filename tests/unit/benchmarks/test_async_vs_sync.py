"""benchmarks/async_vs_sync.py's measurements from a recorded metrics log (the plot fixture: 6
learner steps about a minute apart, 8 episodes of 32 env steps each, 35 s of batch wait)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.async_vs_sync import measure, overlap_bounds

FIXTURE = Path(__file__).parents[1] / "evaluation" / "fixtures" / "run_a"


def test_rates_over_the_window_from_the_first_step_to_the_last():
    m = measure(FIXTURE, envs=2)
    assert m["learner_steps"] == 6
    assert m["learner_steps_per_hour"] == pytest.approx(5 / m["window_s"] * 3600)
    assert m["episodes_per_s"] == pytest.approx(5 * 8 / m["window_s"])
    assert m["env_steps_per_s"] == pytest.approx(5 * 32 / m["window_s"])
    assert m["learner_idle_fraction"] == pytest.approx(5 * 35.0 / m["window_s"])
    assert m["actor_idle_fraction"] == 0.0  # 355 actor-seconds of episodes per ~65 s step: more than 2 envs' time
    assert m["staleness_max"] == 1


def test_fewer_than_two_steps_leave_no_window(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"record": "step", "step": 1}\n')
    assert "error" in measure(tmp_path, envs=2)


def test_a_run_without_a_metrics_log_is_measured_as_no_window(tmp_path):
    assert measure(tmp_path, envs=2)["learner_steps"] == 0


def test_the_overlap_bounds_follow_from_the_cores_use_of_both_modes():
    sync = {"cpu_busy_fraction": 0.8, "cpu_seconds_per_learner_step": 72.0}
    async_ = {"cpu_busy_fraction": 0.95, "cpu_seconds_per_learner_step": 81.0}
    bounds = overlap_bounds(async_, sync)
    assert bounds["async_bound_from_sync_idle_cores"] == pytest.approx(1.25)
    assert bounds["async_over_sync_cpu_seconds_per_step"] == pytest.approx(1.125)
    # the ratio they explain: steps per second = busy fraction x cores / CPU seconds per step
    ratio = (0.95 * 2 / 81.0) / (0.8 * 2 / 72.0)
    assert ratio == pytest.approx(1.25 / 1.125 * 0.95)
    assert overlap_bounds(async_, {"error": "no window"}) == {}
