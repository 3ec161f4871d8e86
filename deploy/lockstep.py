"""The lockstep audit of a run: did the policy server generate while the learner stepped?

In sync mode (pipeline.mode=sync; the replay buffer's rounds, replay_buffer/buffer.py) it must not:
the actors play one version's groups, then wait while the learner steps and pushes. In async mode
the overlap is the point of being asynchronous. While a run goes on, poll_generation reads the
policy server's metrics every POLL_S (its generated-token counter and its requests in flight); once
it has ended, lockstep_audit checks each learner step's busy interval (from the learner's metrics
log) against those polls. benchmarks/async_vs_sync.py reports the audit of both modes, and
tests/integration/test_sync_mode.py asserts a clean one for sync mode.
"""

from __future__ import annotations

import time
from pathlib import Path

from deploy.harness import LaunchedRun
from deploy.monitor import scrape, total
from evaluation.plot import read_log

POLL_S = 0.25  # how often the policy server's generation metrics are read during a run


def poll_generation(run: LaunchedRun) -> list[tuple[float, float, float]]:
    """Until the run ends, every POLL_S: (wall time, generated tokens so far, requests in flight)
    of its first policy server (a read it does not answer is left out)."""
    host, port = run.cfg.metrics.host, run.cfg.metrics.port("policy_server", 0)
    polls = []
    while run.alive():
        samples = scrape(host, port, timeout_s=1.0)
        if samples:
            polls.append(
                (
                    time.time(),
                    total(samples, "empo2_policy_server_generated_tokens_total"),
                    total(samples, "empo2_policy_server_requests_in_flight"),
                )
            )
        time.sleep(POLL_S)
    return polls


def polled_run(overrides: list[str], run_dir: Path, cwd: Path | None = None) -> list[tuple[float, float, float]]:
    """empo2-run with `overrides` in `run_dir` until it ends (its step target, or launch.timeout_s),
    its generation polled meanwhile (poll_generation); stopped with every role on any exit."""
    run = LaunchedRun(overrides, run_dir, cwd=cwd)
    try:
        return poll_generation(run)
    finally:
        run.stop()


def step_records(run_dir: Path) -> list[dict]:
    """The learner's step records (a cut last line skipped); none when the run ended before its
    first learner step (see its launch.out)."""
    try:
        return read_log(run_dir)[0]
    except FileNotFoundError:
        return []


def busy_intervals(steps: list[dict]) -> list[tuple[float, float]]:
    """(start, end) wall times of each learner step's work after its batch arrived: the record is
    written at the end, and its phases other than batch_wait are the work (learner/step.py PHASES)."""
    return [
        (r["wall_time"] - sum(s for p, s in r["phase_seconds"].items() if p != "batch_wait"), r["wall_time"])
        for r in steps
    ]


def lockstep_audit(steps: list[dict], polls: list[tuple[float, float, float]]) -> dict:
    """Generation inside the learner's busy intervals, from `polls` of the policy server: (wall
    time, generated tokens so far, requests in flight). An interval is shrunk by one poll period at
    each end, so a generation that finished just before the step or starts just after it, within
    the polling resolution, does not count."""
    tokens, in_flight, checked = 0.0, 0, 0
    for start, end in busy_intervals(steps):
        inside = [p for p in polls if start + POLL_S < p[0] < end - POLL_S]
        if len(inside) < 2:
            continue
        checked += 1
        tokens += inside[-1][1] - inside[0][1]
        in_flight += sum(1 for p in inside if p[2] > 0)
    return {
        "steps_checked": checked,
        "polls": len(polls),
        "generated_tokens_during_learner_steps": tokens,
        "polls_with_requests_in_flight_during_learner_steps": in_flight,
    }
