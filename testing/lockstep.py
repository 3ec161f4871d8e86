"""The lockstep audit of a run: did the policy server generate while the learner stepped?

In sync mode (pipeline.mode=sync; the replay buffer's rounds, replay_buffer/buffer.py) it must not:
the actors play one version's groups, then wait while the learner steps and pushes. In async mode
the overlap is the point of being asynchronous. While a run goes on, poll_generation reads the
policy server's metrics every POLL_S (its generated-token counter and its requests in flight) and
the machine's CPU time; once it has ended, lockstep_audit checks each learner step's busy interval
(from the learner's metrics log) against those polls, and cpu_use says how busy the cores were.
benchmarks/async_vs_sync.py reports both for both modes, and tests/integration/test_sync_mode.py
asserts a clean audit for sync mode.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import NamedTuple

import psutil

from common.metrics import POLICY_SERVER_GENERATED_TOKENS, POLICY_SERVER_REQUESTS_IN_FLIGHT, read_log
from deploy.monitor import scrape, total
from testing.harness import LaunchedRun

POLL_S = 0.25  # how often the policy server's generation metrics are read during a run


class Poll(NamedTuple):
    time: float  # wall time
    generated_tokens: float  # the policy server's generated tokens so far
    requests_in_flight: float
    cpu_busy_s: float = 0.0  # the machine's CPU seconds so far, all cores: busy (not idle, not waiting on I/O)
    cpu_total_s: float = 0.0  # ... and in all


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, summed over its cores; busy
    counts every process, niced ones too."""
    times = psutil.cpu_times()
    # Linux counts a guest's time in user and nice too: left out once
    total_s = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total_s - times.idle - getattr(times, "iowait", 0.0), total_s


def poll_generation(run: LaunchedRun) -> list[Poll]:
    """Until the run ends, every POLL_S: a Poll of its first policy server and of the machine (a
    read the server does not answer is left out)."""
    host, port = run.cfg.metrics.host, run.cfg.metrics.port("policy_server", 0)
    polls = []
    while run.alive():
        samples = scrape(host, port, timeout_s=1.0)
        if samples:
            polls.append(
                Poll(
                    time.time(),
                    total(samples, POLICY_SERVER_GENERATED_TOKENS),
                    total(samples, POLICY_SERVER_REQUESTS_IN_FLIGHT),
                    *machine_cpu_seconds(),
                )
            )
        time.sleep(POLL_S)
    return polls


def polled_run(overrides: list[str], run_dir: Path, cwd: Path | None = None) -> list[Poll]:
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


def lockstep_audit(steps: list[dict], polls: list[Poll]) -> dict:
    """Generation inside the learner's busy intervals, from `polls` of the policy server: (wall
    time, generated tokens so far, requests in flight). An interval is shrunk by one poll period at
    each end, so a generation that finished just before the step or starts just after it, within
    the polling resolution, does not count."""
    tokens, in_flight, checked = 0.0, 0, 0
    for start, end in busy_intervals(steps):
        inside = [p for p in polls if start + POLL_S < p.time < end - POLL_S]
        if len(inside) < 2:
            continue
        checked += 1
        tokens += inside[-1].generated_tokens - inside[0].generated_tokens
        in_flight += sum(1 for p in inside if p.requests_in_flight > 0)
    return {
        "steps_checked": checked,
        "polls": len(polls),
        "generated_tokens_during_learner_steps": tokens,
        "polls_with_requests_in_flight_during_learner_steps": in_flight,
    }


def cpu_use(steps: list[dict], polls: list[Poll]) -> dict:
    """How busy the machine's cores were from the first learner step's record to the last (the
    window the rates are measured over): the busy fraction of all cores, and the CPU seconds per
    learner step (busy CPU seconds in the window / steps in it). Two modes that do the same work per
    step differ in the second only by what running side by side costs; the first says how much of
    the cores a mode leaves idle: a mode busy a fraction b of the time could at most be 1/b times
    as fast on the same cores, were the idle time filled with its own work at no extra cost."""
    if len(steps) < 2:
        return {}
    start, end = steps[0]["wall_time"], steps[-1]["wall_time"]
    inside = [p for p in polls if start <= p.time <= end]
    if len(inside) < 2 or inside[-1].cpu_total_s <= inside[0].cpu_total_s:
        return {}
    busy = inside[-1].cpu_busy_s - inside[0].cpu_busy_s
    return {
        "cpu_busy_fraction": busy / (inside[-1].cpu_total_s - inside[0].cpu_total_s),
        "cpu_seconds_per_learner_step": busy / (len(steps) - 1),
    }
