"""Async vs sync: the same pipeline (empo2-run, every role a process) in pipeline.mode=async and
pipeline.mode=sync, on the same config, for the same wall budget each, in one invocation.

Each mode runs `python -m pipeline empo2-run` with launch.timeout_s = --budget-s (the budget ends the
run; learner.total_steps is out of reach) in its own run dir, then its metrics log
(<run_dir>/metrics.jsonl, one record per learner step) is read. Rates are over the window from
the first learner step to the last (the start-up, the same in both modes, is left out):
  learner_steps_per_hour   (steps in the window) / window
  episodes_per_s, env_steps_per_s   of the episodes the learner trained on in the window
  learner_idle_fraction    the learner's batch_wait seconds / window
  actor_idle_fraction      1 - (actor-seconds spent in episodes) / (window x envs): the time the
                           env actors had no episode to play (told to wait, or waiting to be told)
  staleness_max            the largest staleness of any trained turn (0 in sync mode by design)
  cpu_busy_fraction, cpu_seconds_per_learner_step   the machine's cores (testing/lockstep.py cpu_use)
and the ratio async / sync of learner steps per hour, with what the cores allow it (overlap_bounds):
1 / sync's busy fraction, and async's CPU seconds per step over sync's. The result goes to
benchmarks/results/async_vs_sync.json.

The lockstep audit (testing/lockstep.py): while a mode runs, the policy server's metrics are polled
every POLL_S (its generated-token counter and its requests in flight), and each learner step's busy
interval (its end in the metrics log, minus the seconds of its phases after the batch arrived) is
checked against them: generated tokens and polls with a request in flight strictly inside a busy
interval. Sync mode must show none (GRPO: no reflection runs on the policy server); async mode
shows how much generation overlaps the learner, the point of being asynchronous.

Run (repository root; starts vLLM, ScienceWorld and the learner: hold the machine's heavy-run lock):
  flock /tmp/empo2-heavy.lock .venv/bin/python -m benchmarks.async_vs_sync --budget-s 1500
  flock /tmp/empo2-heavy.lock .venv/bin/python -m benchmarks.async_vs_sync --budget-s 1200 --cores partitioned
  flock /tmp/empo2-heavy.lock .venv/bin/python -m benchmarks.async_vs_sync --budget-s 600 --cores fair
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.record import REPO, run_header, write_result
from testing.lockstep import cpu_use, lockstep_audit, polled_run, step_records

# the CPU profile with two groups in flight, so the async mode can play ahead of the learner (the
# profile's 1 and 1 would make both modes lockstep); ports away from the defaults and the tests'
CONFIG = [
    "profile=cpu",
    # GRPO (p = 0): no memory service work (reflections on the policy server: the env actors report no
    # episode when no rollout reads the memory) competing for the two cores in either mode, and no long seeded reflection prompt (vLLM 0.32's CPU engine died on one
    # here: "CPU Generator does not use offset", when a seeded request's prefill is chunked)
    "preset=grpo",
    "learner.total_steps=100000",
    "replay_buffer.max_open_groups=2",
    "replay_buffer.max_ready_groups=2",
    "learner.max_staleness=4",
    # the CPU profile's prompt (demonstration, whole chat): each episode is one chain the learner scores
    # once (learner.packing), so a budget of minutes holds several steps
    "endpoints.policy_servers=[tcp://127.0.0.1:44550]",
    "endpoints.replay_buffer=tcp://127.0.0.1:44560",
    "endpoints.memory_service=tcp://127.0.0.1:44570",
    "metrics.base_port=45000",
]
# --cores: how the two cores are shared. colocated: every stage uses both (the profile's threads:
# torch's default, one vLLM OpenMP thread per core) and the profile's pipeline.rollout_nice (10: the
# learner takes the cores first, the rollouts fill its idle time); fair: the same at an equal share
# (rollout_nice 0), so in async mode the learner and vLLM contend; partitioned: one core each (the
# learner one torch thread, vLLM one OpenMP thread pinned to core 0, equal shares), the CPU image of
# the anchors' separate trainer and inference GPUs, where a stage that waits leaves its device idle in
# either mode
CORES = {
    "colocated": [],
    "fair": ["pipeline.rollout_nice=0"],
    "partitioned": ["learner.torch_threads=1", "policy_server.cpu_omp_threads_bind=0", "pipeline.rollout_nice=0"],
}


def measure(run_dir: Path, envs: int) -> dict:
    steps = step_records(run_dir)
    if len(steps) < 2:
        return {"learner_steps": len(steps), "error": "fewer than 2 learner steps: no window to measure"}
    window_steps = steps[1:]  # the window opens at the first step's record
    window = steps[-1]["wall_time"] - steps[0]["wall_time"]
    busy = sum(s for r in window_steps for p, s in r["rollout_phase_seconds"].items() if p != "assignment_wait")
    return {
        "learner_steps": len(steps),
        "window_s": window,
        "learner_steps_per_hour": len(window_steps) / window * 3600,
        "episodes_per_s": sum(r["episodes"] for r in window_steps) / window,
        "env_steps_per_s": sum(r["env_steps"] for r in window_steps) / window,
        "learner_idle_fraction": sum(r["phase_seconds"].get("batch_wait", 0.0) for r in window_steps) / window,
        "actor_idle_fraction": max(0.0, 1 - busy / (window * envs)),
        "staleness_max": max(r["staleness_max_versions"] for r in steps),
        "staleness_mean": sum(r["staleness_mean_versions"] for r in steps) / len(steps),
        "step_seconds_mean": sum(r["step_seconds"] for r in steps) / len(steps),
    }


def overlap_bounds(async_: dict, sync: dict) -> dict:
    """What the cores allow. Async can beat sync only by filling the time sync leaves the cores
    idle: on the same cores, with the same CPU work per step, at most 1 / (sync's busy fraction).
    What it gets of that is cut by what side by side costs (its CPU seconds per step over sync's)
    and by the idle time it still leaves (its own busy fraction)."""
    if not (async_.get("cpu_busy_fraction") and sync.get("cpu_busy_fraction")):
        return {}
    return {
        "async_bound_from_sync_idle_cores": 1 / sync["cpu_busy_fraction"],
        "async_over_sync_cpu_seconds_per_step": async_["cpu_seconds_per_learner_step"]
        / sync["cpu_seconds_per_learner_step"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="async_vs_sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=300.0, help="wall budget per mode (start-up included)")
    parser.add_argument("--cores", choices=list(CORES), default="colocated", help="how the stages share the cores")
    parser.add_argument("--run-root", default="runs/async_vs_sync")
    parser.add_argument("--out", default=None, help="default benchmarks/results/async_vs_sync[_partitioned].json")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides, for both modes")
    args = parser.parse_args(argv)
    from pipeline.config import load_config

    suffix = "" if args.cores == "colocated" else f"_{args.cores}"
    out = args.out or REPO / "benchmarks" / "results" / f"async_vs_sync{suffix}.json"
    config = [*CONFIG, *CORES[args.cores], *args.overrides, f"launch.timeout_s={args.budget_s}"]
    cfg = load_config(config)
    envs = cfg.launch.num_env_actors * cfg.env_actor.envs_per_actor
    result = {**run_header([".venv/bin/python", "-m", "benchmarks.async_vs_sync"], sys.argv[1:]), "config": config}
    for mode in ("async", "sync"):
        run_dir = (REPO / args.run_root / f"{mode}-{int(time.time())}").resolve()
        run_dir.mkdir(parents=True)
        print(f"[async_vs_sync] {mode}: {args.budget_s:.0f}s in {run_dir}", flush=True)
        polls = polled_run([*config, f"pipeline.mode={mode}"], run_dir, cwd=REPO)
        result[mode] = {"run_dir": str(run_dir.relative_to(REPO)), **measure(run_dir, envs)}
        result[mode] |= cpu_use(step_records(run_dir), polls)
        result[mode]["lockstep_audit"] = lockstep_audit(step_records(run_dir), polls)
        print(f"[async_vs_sync] {mode}: {json.dumps(result[mode])}", flush=True)
    a, s = result["async"].get("learner_steps_per_hour"), result["sync"].get("learner_steps_per_hour")
    result["async_over_sync_learner_steps_per_hour"] = a / s if a and s else None
    result |= overlap_bounds(result["async"], result["sync"])
    write_result(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
