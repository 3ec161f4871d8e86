"""benchmarks/async_vs_sync.py's measurements from a recorded metrics log (the plot fixture: 6
learner steps about a minute apart, 8 episodes of 32 env steps each, 35 s of batch wait)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.async_vs_sync import busy_intervals, lockstep_audit, measure

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


def _step(end: float, work_s: float, wait_s: float) -> dict:
    return {"wall_time": end, "phase_seconds": {"batch_wait": wait_s, "forward_backward": work_s - 1, "push": 1.0}}


def test_the_lockstep_audit_counts_generation_inside_a_learner_step_only():
    steps = [_step(100.0, 10.0, 30.0), _step(150.0, 10.0, 40.0)]  # busy 90-100 and 140-150
    assert busy_intervals(steps) == [(90.0, 100.0), (140.0, 150.0)]
    # tokens grow while the actors play (before 90 and 100-140) and not inside the busy intervals
    polls = [(t / 4, float(t), 0.0) for t in range(0, 4 * 90)]
    polls += [(90 + t / 4, 360.0, 0.0) for t in range(1, 40)]
    polls += [(100 + t / 4, 360.0 + t, 1.0) for t in range(0, 160)]
    polls += [(140 + t / 4, 520.0, 0.0) for t in range(1, 40)]
    clean = lockstep_audit(steps, polls)
    assert clean["steps_checked"] == 2
    assert clean["generated_tokens_during_learner_steps"] == 0
    assert clean["polls_with_requests_in_flight_during_learner_steps"] == 0
    # a generation running in the middle of the second step is found
    overlapping = [(t, tok + (5.0 if t >= 145 else 0.0), 1.0 if 144 <= t < 145 else 0.0) for t, tok, _ in polls]
    found = lockstep_audit(steps, overlapping)
    assert found["generated_tokens_during_learner_steps"] == 5.0
    assert found["polls_with_requests_in_flight_during_learner_steps"] == 4
