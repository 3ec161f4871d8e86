"""The lockstep audit (testing/lockstep.py): generation is counted inside a learner step's busy
interval only; the machine's CPU use is read over the window of the learner's steps."""

from __future__ import annotations

import pytest

from testing.lockstep import Poll, busy_intervals, cpu_use, lockstep_audit, machine_cpu_seconds


def _step(end: float, work_s: float, wait_s: float) -> dict:
    return {"wall_time": end, "phase_seconds": {"batch_wait": wait_s, "forward_backward": work_s - 1, "push": 1.0}}


def test_the_lockstep_audit_counts_generation_inside_a_learner_step_only():
    steps = [_step(100.0, 10.0, 30.0), _step(150.0, 10.0, 40.0)]  # busy 90-100 and 140-150
    assert busy_intervals(steps) == [(90.0, 100.0), (140.0, 150.0)]
    # tokens grow while the actors play (before 90 and 100-140) and not inside the busy intervals
    polls = [Poll(t / 4, float(t), 0.0) for t in range(0, 4 * 90)]
    polls += [Poll(90 + t / 4, 360.0, 0.0) for t in range(1, 40)]
    polls += [Poll(100 + t / 4, 360.0 + t, 1.0) for t in range(0, 160)]
    polls += [Poll(140 + t / 4, 520.0, 0.0) for t in range(1, 40)]
    clean = lockstep_audit(steps, polls)
    assert clean["steps_checked"] == 2
    assert clean["generated_tokens_during_learner_steps"] == 0
    assert clean["polls_with_requests_in_flight_during_learner_steps"] == 0
    # a generation running in the middle of the second step is found
    overlapping = [
        Poll(p.time, p.generated_tokens + (5.0 if p.time >= 145 else 0.0), 1.0 if 144 <= p.time < 145 else 0.0)
        for p in polls
    ]
    found = lockstep_audit(steps, overlapping)
    assert found["generated_tokens_during_learner_steps"] == 5.0
    assert found["polls_with_requests_in_flight_during_learner_steps"] == 4


def test_cpu_use_is_read_over_the_window_of_the_learner_steps():
    steps = [_step(100.0, 10.0, 30.0), _step(150.0, 10.0, 40.0), _step(200.0, 10.0, 40.0)]
    # 2 cores: fully busy before the window (ignored), 3/4 busy inside it (75 of 100 CPU-s per 50 s)
    polls = [Poll(t, 0.0, 0.0, 2.0 * t, 2.0 * t) for t in range(0, 100, 10)]
    polls += [Poll(t, 0.0, 0.0, 200.0 + 1.5 * (t - 100), 200.0 + 2.0 * (t - 100)) for t in range(100, 201, 10)]
    use = cpu_use(steps, polls)
    assert use["cpu_busy_fraction"] == pytest.approx(0.75)
    assert use["cpu_seconds_per_learner_step"] == pytest.approx(1.5 * 100 / 2)
    assert cpu_use(steps[:1], polls) == {}  # no window
    assert cpu_use(steps, [p for p in polls if p.time < 100]) == {}  # no polls inside it


def test_the_machine_cpu_seconds_grow_with_work():
    busy, total = machine_cpu_seconds()
    assert 0 < busy <= total
    sum(range(5_000_000))  # ~0.1 s of this process's CPU: several clock ticks
    busy_after, total_after = machine_cpu_seconds()
    assert busy_after > busy and total_after > total
