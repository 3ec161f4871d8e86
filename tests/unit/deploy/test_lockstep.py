"""The lockstep audit (deploy/lockstep.py): generation is counted inside a learner step's busy
interval only."""

from __future__ import annotations

from deploy.lockstep import busy_intervals, lockstep_audit


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
