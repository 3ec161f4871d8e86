"""The chaos soak (issue 26, item 7): the pipeline trains with two policy servers while a seeded
schedule SIGKILLs, or SIGSTOPs and later SIGCONTs, a random role every --gap seconds; then an audit.

    flock /tmp/empo2-heavy.lock .venv/bin/python -m benchmarks.chaos                  # CPU profile, >= 30 min
    .venv/bin/python -m benchmarks.chaos --profile e2e --steps 6 --minutes 6 --gap 20 40 --out /tmp/chaos.json
                                                          # the short variant (tests/unit/benchmarks/test_chaos.py, long)

The schedule (fault times, roles, kinds, stop lengths) comes from --seed alone and is written first,
so a soak is repeatable and its faults are known before it starts. Faults start once every role is up
and the learner has taken its first step, and go on until the launcher ends (the step target) or
--minutes pass; a role is picked among those running at that moment. A sampler reads every role's
metrics and RSS each second. The audit, each item a list of what broke it (empty = clean):

  - the run ends `done` at its step target (--steps), every server at the final version
  - every episode an env actor saw acknowledged is in the buffer's log exactly once; no group is
    recorded as used twice; no record of the log is skipped as corrupt (testing/harness.episode_audit)
  - a policy server's version never goes backwards once it has served: over the samples where its
    generated tokens grew, across its restarts
  - the memory entries counted as stored before a memory service kill are there after its restart
  - nothing is left behind: no vLLM or JVM process of the run (its own: marked in their environment, so
    another pipeline beside the soak is not counted), nothing new in /dev/shm
  - liveness: after the last fault, no window without a learner step longer than LIVENESS_FACTOR x the
    soak's median step gap (each fault's time to the next step is reported: next_step_s)
  - each role's RSS is bounded: its peak in the last third of the soak is at most 1.5x (+256 MB) its
    peak in the first third; the learner's, its resident memory after each step (StepStats.resident_mb,
    the freed heap given back) in the last third of its steps against the first third: its peak
    follows the step's micro-batches, and a short soak's first steps may fill none (reported only)

Results: --out (JSON: the schedule, every fault with the time its role took to answer again, the
restarts per role and reason, the steps reached, the RSS peaks, the audit) and a timeline plot beside
it (versions, learner steps, faults, RSS). Every process started is stopped at the end, also on an error.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from benchmarks.record import REPO, run_header, write_result
from common.metrics import (
    LEARNER_POLICY_VERSION,
    LEARNER_STEPS,
    MEMORY_SERVICE_ENTRIES,
    METRICS_LOG,
    POLICY_SERVER_GENERATED_TOKENS,
    POLICY_SERVER_POLICY_VERSION,
    REPLAY_BUFFER_OPEN_SLOTS,
    REPLAY_BUFFER_TRAJECTORIES_ACCEPTED,
)
from deploy.monitor import scrape, total
from deploy.run_state import read_state
from pipeline.config import load_config
from testing.harness import LaunchedRun, episode_audit, leftover_processes

RESULTS = REPO / "benchmarks" / "results"
BASE = 2100  # metrics.base_port: servers 2100-01, buffer 2200, memory 2201, launcher 2202, learner 2300, ...
ENDPOINTS = [
    "endpoints.policy_servers=[tcp://127.0.0.1:3550,tcp://127.0.0.1:3551]",
    "endpoints.replay_buffer=tcp://127.0.0.1:3560",
    "endpoints.memory_service=tcp://127.0.0.1:3570",
    f"metrics.base_port={BASE}",
]
RSS_GROWTH, RSS_SLACK_MB = 1.5, 256.0


@dataclass
class Fault:
    at_s: float  # after the faults start
    kind: str  # kill | stop
    pick: float  # in [0, 1): which of the roles running then
    stop_s: float  # how long a stopped role stays stopped
    phase: int = 0  # actor_kill: the episodes of the group already in when its actor is killed


@dataclass
class Injected:
    at_s: float
    kind: str
    role: str
    stop_s: float
    recovered_s: float | None = None  # from the fault until the role's metrics answer again (after SIGCONT: from it)
    next_step_s: float | None = None  # from the fault's end (a stop: its SIGCONT) to the next learner step


def schedule(
    seed: int,
    minutes: float,
    gap: tuple[float, float],
    stop: tuple[float, float],
    actor_kills: float = 0.0,
    group_size: int = 4,
) -> list[Fault]:
    """The faults of a soak, from its seed alone: one every uniform(gap) seconds for `minutes`. A share
    `actor_kills` of them SIGKILL an env actor in the middle of an episode at a phase of its group (how many
    of the group's episodes are in: 0, 1, ..., group_size - 1 in turn, so every phase is hit)."""
    rng, faults, t = random.Random(seed), [], 0.0
    while True:
        t += rng.uniform(*gap)
        if t >= minutes * 60:
            return faults
        kind = "actor_kill" if rng.random() < actor_kills else rng.choice(["kill", "stop"])
        phase = sum(f.kind == "actor_kill" for f in faults) % group_size if kind == "actor_kill" else 0
        faults.append(Fault(round(t, 1), kind, rng.random(), round(rng.uniform(*stop), 1), phase))


def role_kind(role: str) -> tuple[str, int]:
    """'policy_server1' -> ('policy_server', 1); 'learner' -> ('learner', 0)."""
    stem = role.rstrip("0123456789")
    return stem, int(role[len(stem) :] or 0)


class Sampler(threading.Thread):
    """Each second, per role: up or not, pid, RSS of its process tree, and the metrics the audit reads."""

    def __init__(self, run: LaunchedRun):
        super().__init__(daemon=True)
        self.launched, self.rows, self.stopped = run, [], threading.Event()
        self.t0 = time.monotonic()

    def sample(self) -> dict:
        row = {"t": round(time.monotonic() - self.t0, 1), "roles": {}}
        cfg = self.launched.cfg
        for name, role in read_state(self.launched.run_dir).get("roles", {}).items():
            kind, index = role_kind(name)
            metrics = scrape(cfg.metrics.host, cfg.metrics.port(kind, index), timeout_s=1.0)
            entry = {"up": bool(role.get("up")), "pid": role.get("pid"), "answers": bool(metrics)}
            entry["rss_mb"] = tree_rss_mb(role.get("pid")) if role.get("up") else None
            if kind == "policy_server":
                entry["version"] = total(metrics, POLICY_SERVER_POLICY_VERSION) if metrics else None
                entry["tokens"] = total(metrics, POLICY_SERVER_GENERATED_TOKENS) if metrics else None
            elif kind == "learner" and metrics:
                entry["steps"] = total(metrics, LEARNER_POLICY_VERSION)
            elif kind == "memory_service" and metrics:
                entry["entries"] = total(metrics, MEMORY_SERVICE_ENTRIES)
            row["roles"][name] = entry
        return row

    def run(self) -> None:
        while not self.stopped.is_set():
            self.rows.append(self.sample())
            self.stopped.wait(1.0)

    def since(self) -> float:
        return time.monotonic() - self.t0


def tree_rss_mb(pid: int | None) -> float | None:
    """RSS of a process and its children (a policy server's vLLM engine core, an actor's JVM), in MB."""
    try:
        proc = psutil.Process(pid)
        return round(sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20, 1)
    except (psutil.Error, TypeError):
        return None


# An actor_kill waits up to this long for its phase (the group's episodes in) and an actor holding a lease
ACTOR_KILL_WAIT_S = 120.0
HOLDER = re.compile(re.escape(REPLAY_BUFFER_OPEN_SLOTS) + r'\{holder="(env_actor\d+)"\}')


def leased_actor(run: LaunchedRun, phase: int) -> str | None:
    """An env actor playing a slot (it holds a lease) while its group has `phase` episodes in, or None. The
    phase is read from the trajectories accepted so far modulo the group size: the open group's own count
    when groups are played one at a time (max_open_groups 1), an approximation otherwise."""
    cfg = run.cfg
    buffer = scrape(cfg.metrics.host, cfg.metrics.port("replay_buffer"), timeout_s=1.0)
    accepted = total(buffer, REPLAY_BUFFER_TRAJECTORIES_ACCEPTED)
    if not buffer or int(accepted) % cfg.replay_buffer.group_size != phase:
        return None
    holders = sorted(m.group(1) for key, v in buffer.items() if v > 0 and (m := HOLDER.fullmatch(key)))
    return holders[0] if holders else None


def inject(run: LaunchedRun, fault: Fault, sampler: Sampler) -> Injected | None:
    """The fault on one of the roles running now (none: skipped); a stop lasts fault.stop_s. An actor_kill
    waits (up to ACTOR_KILL_WAIT_S) for an env actor mid-episode at the fault's phase of its group."""
    roles = {n: r for n, r in read_state(run.run_dir).get("roles", {}).items() if r.get("up")}
    if not roles:
        return None
    name = sorted(roles)[int(fault.pick * len(roles))]
    if fault.kind == "actor_kill":
        deadline = time.monotonic() + ACTOR_KILL_WAIT_S
        while (name := leased_actor(run, fault.phase)) is None or name not in roles:
            if time.monotonic() > deadline or not run.alive():
                print(f"[chaos] no env actor mid-episode at phase {fault.phase}: skipped", flush=True)
                return None
            time.sleep(0.2)
            roles = {n: r for n, r in read_state(run.run_dir).get("roles", {}).items() if r.get("up")}
    done = Injected(round(sampler.since(), 1), fault.kind, name, fault.stop_s if fault.kind == "stop" else 0.0)
    print(
        f"[chaos] t={done.at_s:.0f}s {fault.kind} {name}" + (f" for {fault.stop_s:.0f}s" if done.stop_s else ""),
        flush=True,
    )
    try:
        if fault.kind in ("kill", "actor_kill"):
            os.kill(
                roles[name]["pid"], signal.SIGKILL
            )  # its main process only, as a crash (the supervisor clears the rest)
        else:  # the whole process group: a policy server's engine core stops with it
            os.killpg(roles[name]["pid"], signal.SIGSTOP)
            time.sleep(fault.stop_s)
            os.killpg(roles[name]["pid"], signal.SIGCONT)
    except ProcessLookupError:  # it ended meanwhile (the run finished, or the launcher's hang check)
        pass
    return done


def recovery(faults: list[Injected], rows: list[dict]) -> None:
    """Each fault's time to recover: from the fault (a stop: its SIGCONT) until a sample sees the role's
    metrics answer again (a killed role: a new pid). None: never within the soak."""
    for f in faults:
        start = f.at_s + f.stop_s
        old_pid = next((r["roles"][f.role]["pid"] for r in rows if r["t"] <= f.at_s and f.role in r["roles"]), None)
        for r in rows:
            e = r["roles"].get(f.role)
            if r["t"] >= start and e and e["answers"] and (f.kind == "stop" or e["pid"] != old_pid):
                f.recovered_s = round(r["t"] - f.at_s, 1)
                break


def version_regressions(rows: list[dict]) -> list[str]:
    """Per policy server, a sample at which it served (its generated tokens grew, or a restarted one's are
    above 0) at a version below one it had served before."""
    found, served, last_tokens = [], {}, {}
    for r in rows:
        for name, e in r["roles"].items():
            if not name.startswith("policy_server") or e.get("tokens") is None:
                continue
            tokens, prev = e["tokens"], last_tokens.get(name, 0.0)
            grew = tokens > prev or (tokens < prev and tokens > 0)  # a counter that fell: a new process
            last_tokens[name] = tokens
            if grew:
                if e["version"] < served.get(name, -1):
                    found.append(f"{name} at t={r['t']}s served version {e['version']:.0f} after {served[name]:.0f}")
                served[name] = max(served.get(name, -1), e["version"])
    return found


# The liveness item: after the last fault, a window this many median step gaps long without a learner step
# (while the run went on) is a stall: the kind of wait a dead peer's lease once held for 30 minutes.
LIVENESS_FACTOR = 4.0


def step_times(rows: list[dict]) -> list[float]:
    """The sample times at which the learner's version first reached each new value."""
    times, best = [], None
    for r in rows:
        steps = r["roles"].get("learner", {}).get("steps")
        if steps is not None and (best is None or steps > best):
            if best is not None:
                times.append(r["t"])
            best = steps
    return times


def next_steps(faults: list[Injected], rows: list[dict]) -> None:
    """Each fault's time from its end (a stop: its SIGCONT) to the next learner step (None: none after it)."""
    times = step_times(rows)
    for f in faults:
        end = f.at_s + f.stop_s
        f.next_step_s = next((round(t - end, 1) for t in times if t > end), None)


def liveness(faults: list[Injected], rows: list[dict], factor: float = LIVENESS_FACTOR) -> list[str]:
    """After the last fault ends, every window between learner steps (and from the fault to the first step)
    at most `factor` x the soak's median step gap; a run that took no step after it is named too."""
    times = step_times(rows)
    if not faults or len(times) < 3:
        return []
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    bound = factor * gaps[len(gaps) // 2]
    last = max(f.at_s + f.stop_s for f in faults)
    after = [last, *(t for t in times if t > last)]
    end = rows[-1]["t"] if rows else last
    if len(after) == 1:  # no step after the last fault: stalled if the soak went on long enough to take one
        return (
            [f"no learner step in the {end - last:.0f}s after the last fault (bound {bound:.0f}s)"]
            if end - last > bound
            else []
        )
    return [
        f"no learner step from t={a:.0f}s to t={b:.0f}s ({b - a:.0f}s, bound {bound:.0f}s: {factor:g} x the median step gap)"
        for a, b in zip(after, after[1:])
        if b - a > bound
    ]


def memory_losses(faults: list[Injected], rows: list[dict]) -> list[str]:
    """After each memory service kill: its first entry count must be at least its last one before."""
    found = []
    for f in faults:
        if f.role != "memory_service" or f.kind != "kill":
            continue
        before = [r["roles"][f.role].get("entries") for r in rows if r["t"] < f.at_s and f.role in r["roles"]]
        before = [b for b in before if b is not None]
        after = [
            r["roles"][f.role].get("entries")
            for r in rows
            if r["t"] > f.at_s and r["roles"].get(f.role, {}).get("entries")
        ]
        if before and after and after[0] < before[-1]:
            found.append(f"memory entries {before[-1]:.0f} before the kill at t={f.at_s}s, {after[0]:.0f} after")
    return found


def rss_peaks(rows: list[dict]) -> dict[str, dict]:
    """Per role, its RSS peak in the first and the last third of the soak (MB)."""
    if not rows:
        return {}
    end = rows[-1]["t"]
    peaks: dict[str, dict] = {}
    for r in rows:
        third = "first" if r["t"] < end / 3 else "last" if r["t"] >= 2 * end / 3 else None
        for name, e in r["roles"].items():
            if third and e.get("rss_mb"):
                p = peaks.setdefault(name, {"first": 0.0, "last": 0.0})
                p[third] = max(p[third], e["rss_mb"])
    return peaks


def learner_floors(metrics: Path) -> dict[str, float]:
    """The learner's resident memory after its steps (MB, the step records of metrics.jsonl): the
    highest in the first and in the last third of the steps."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    floors = [r["resident_mb"] for r in records if r.get("record") == "step" and r.get("resident_mb")]
    third = max(1, len(floors) // 3)
    return {"first": max(floors[:third]), "last": max(floors[-third:])} if floors else {}


def rss_growth(peaks: dict[str, dict]) -> list[str]:
    """The roles whose last-third RSS is over RSS_GROWTH times (+RSS_SLACK_MB) their first third's."""
    return [
        f"{name}: {p['first']:.0f} MB -> {p['last']:.0f} MB"
        for name, p in peaks.items()
        if p and p["first"] and p["last"] > RSS_GROWTH * p["first"] + RSS_SLACK_MB
    ]


def audit(
    run: LaunchedRun,
    rc: int,
    summary: dict,
    faults,
    rows,
    before: tuple[set, set],
    steps: int,
    rss: dict[str, dict],
    mark: str | None = None,
) -> dict:
    """`rss`: per role, the first and last third's memory to judge (rss_growth); `mark`: the run's
    processes' mark (leftover_processes): another pipeline beside the soak is not its leftover."""
    processes_before, shm_before = before
    out = {
        "run": [] if rc == 0 and summary.get("outcome") == "done" and summary.get("policy_version") == steps
        else [f"exit {rc}, outcome {summary.get('outcome')}, version {summary.get('policy_version')} of {steps}"],
        "servers_at_end": [] if set(summary.get("server_versions_at_end", [])) == {steps}
        else [f"server versions at the end {summary.get('server_versions_at_end')}"],
    }  # fmt: skip
    episodes = episode_audit(run.cfg)
    out["episodes"] = [f"{k}: {v[:5]}" for k, v in episodes.items() if isinstance(v, list) and v] + (
        [f"{episodes['skipped_records']} records skipped"] if episodes["skipped_records"] else []
    )
    out["server_versions"] = version_regressions(rows)
    out["memory"] = memory_losses(faults, rows)
    db = run.cfg.run_path(run.cfg.memory_service.db_file)
    stored = 0
    if db.exists():
        with closing(sqlite3.connect(db)) as conn:
            stored = conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
    seen = max((e.get("entries") or 0 for r in rows for n, e in r["roles"].items() if n == "memory_service"), default=0)
    if stored < seen:
        out["memory"].append(f"{stored} entries in the store at the end, {seen:.0f} counted during the soak")
    time.sleep(2)
    left = {pid: cmd for pid, cmd in leftover_processes(mark).items() if pid not in processes_before}
    out["left_behind"] = [*left.values(), *sorted(set(os.listdir("/dev/shm")) - shm_before)]
    out["rss"] = rss_growth(rss)
    out["liveness"] = liveness(faults, rows)
    return {**out, "episode_counts": {k: episodes[k] for k in ("logged", "acknowledged")}}


def plot(rows: list[dict], faults: list[Injected], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    names = sorted({n for r in rows for n in r["roles"]})
    for name in names:
        key = "version" if name.startswith("policy_server") else "steps" if name == "learner" else None
        if key:
            pts = [(r["t"], r["roles"][name][key]) for r in rows if r["roles"].get(name, {}).get(key) is not None]
            if pts:
                top.plot(*zip(*pts), label=f"{name} {key}", lw=1.2)
        pts = [(r["t"], r["roles"][name]["rss_mb"]) for r in rows if r["roles"].get(name, {}).get("rss_mb")]
        if pts:
            bottom.plot(*zip(*pts), label=name, lw=1)
    for f in faults:
        for ax in (top, bottom):
            if f.kind == "kill":
                ax.axvline(f.at_s, color="red", alpha=0.5, lw=1)
            else:
                ax.axvspan(f.at_s, f.at_s + f.stop_s, color="orange", alpha=0.3)
        top.annotate(f.role, (f.at_s, 0), rotation=90, fontsize=7, va="bottom")
    top.set_ylabel("policy version")
    top.set_title("chaos soak: red = SIGKILL, orange = SIGSTOP..SIGCONT")
    bottom.set_ylabel("RSS MB (process tree)")
    bottom.set_xlabel("seconds since the first learner step")
    top.legend(fontsize=7, loc="upper left")
    bottom.legend(fontsize=7, loc="upper left", ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--steps", type=int, default=16, help="learner.total_steps: the target the run must reach")
    parser.add_argument("--minutes", type=float, default=30.0, help="faults are scheduled over this long")
    parser.add_argument("--gap", type=float, nargs=2, default=[30.0, 90.0], help="seconds between faults")
    parser.add_argument("--stop", type=float, nargs=2, default=[5.0, 30.0], help="seconds a SIGSTOP lasts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--actors", type=int, default=2, help="launch.num_env_actors")
    parser.add_argument(
        "--actor-kills",
        type=float,
        default=0.0,
        help="share of the faults that SIGKILL an env actor mid-episode, at each phase of its group in turn",
    )
    parser.add_argument(
        "--run-dir", default=None, help="default: a temporary directory, removed at the end if the audit is clean"
    )
    parser.add_argument("--out", default=str(RESULTS / "chaos.json"))
    parser.add_argument("overrides", nargs="*", help="more key=value overrides (e.g. learner.micro_batch_tokens=4096)")
    args = parser.parse_args(argv)
    header = run_header([".venv/bin/python", "-m", "benchmarks.chaos"], sys.argv[1:] if argv is None else argv)
    group_size = load_config([f"profile={args.profile}", *args.overrides]).replay_buffer.group_size
    faults = schedule(args.seed, args.minutes, tuple(args.gap), tuple(args.stop), args.actor_kills, group_size)
    out = Path(args.out)
    write_result(out, {**header, "schedule": [asdict(f) for f in faults], "state": "running"})
    overrides = [
        f"profile={args.profile}",
        *ENDPOINTS,
        f"learner.total_steps={args.steps}",
        "learner.checkpoint_every=1",  # a killed learner loses at most the step it was taking
        f"launch.num_env_actors={args.actors}",
        "launch.restart_budget=20",  # a soak kills the same role several times within the restart window
        "launch.backoff_s=2",
        f"launch.timeout_s={args.minutes * 60 * 3}",
        "launch.progress_every_s=30",
        *args.overrides,
    ]
    mark = uuid.uuid4().hex  # the soak's own processes (leftover_processes): not another pipeline's beside it
    before = (set(leftover_processes(mark)), set(os.listdir("/dev/shm")))
    root = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="empo2-chaos-"))
    run = LaunchedRun(overrides, root / "run", args.minutes * 60 * 3, cwd=REPO, mark=mark)
    injected: list[Injected] = []
    sampler = Sampler(run)
    try:
        run.wait_for("the first learner step", lambda: run.metric("learner", LEARNER_STEPS) >= 1, 2)
        sampler.t0 = time.monotonic()  # the schedule's clock starts at the first learner step
        sampler.start()
        print(f"[chaos] first learner step: {len(faults)} faults over {args.minutes:g} min", flush=True)
        for fault in faults:
            while sampler.since() < fault.at_s and run.alive():
                time.sleep(0.5)
            if not run.alive():
                break
            if (done := inject(run, fault, sampler)) is not None:
                injected.append(done)
        rc = run.wait()
    finally:
        sampler.stopped.set()
        run.stop(grace_s=180)
    sampler.join(5)
    summary = json.loads((run.run_dir / "summary.json").read_text()) if (run.run_dir / "summary.json").exists() else {}
    recovery(injected, sampler.rows)
    next_steps(injected, sampler.rows)
    peaks, floors = rss_peaks(sampler.rows), learner_floors(run.cfg.run_path(METRICS_LOG))
    # the learner judged by its memory after each step; its sampled peak is reported only
    report = audit(run, rc, summary, injected, sampler.rows, before, args.steps, {**peaks, "learner": floors}, mark)
    clean = not any(v for k, v in report.items() if k != "episode_counts")
    if not args.run_dir and clean:
        shutil.rmtree(root, ignore_errors=True)
    elif not clean:  # the logs say what the audit cannot (a version's path through the pushes, a restart)
        print(f"[chaos] the audit is not clean: the run's logs are kept in {root / 'run'}", flush=True)
    result = {
        **header,
        "profile": args.profile,
        "steps": args.steps,
        "minutes": args.minutes,
        "schedule": [asdict(f) for f in faults],
        "faults": [asdict(f) for f in injected],
        "soak_seconds": sampler.rows[-1]["t"] if sampler.rows else 0,
        "steps_reached": summary.get("policy_version"),
        "restarts": summary.get("restarts", {}),
        "rss_peaks_mb": peaks,
        "learner_resident_after_steps_mb": floors,
        "audit": report,
        "clean": clean,
    }
    write_result(out, result)
    plot(sampler.rows, injected, out.with_suffix(".png"))
    print(
        f"[chaos] {len(injected)} faults, {result['soak_seconds']:.0f}s, clean: {clean}\n{json.dumps(report, indent=1)}"
    )
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
