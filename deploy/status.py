"""empo2-status: one screen on a running pipeline, from the roles' own metrics endpoints.

    empo2-status [RUN_DIR] [--json] [--interval S] [key=value ...]

On a run that has ended (the launcher recorded it in its state, deploy/run_state.py): finished,
with the outcome, the launcher's exit status, the final policy version, the run's summary and each
role's exit status at the stop, and no scrape.

Per role: up or down, restarts and last exit (from the launcher's <run_dir>/launch/state.json),
policy version, errors, and the last ERROR line of its log; for the run: episodes/s, env steps/s,
generated and learner tokens/s (two scrapes `--interval` seconds apart), learner step and mean
time per step, buffer depth (complete groups ready), staleness, memory entries and hits per
retrieval; what the buffer's open groups wait for, and a stall naming the starving stage (slots
leased to an env actor that is down or has stopped renewing them, or free slots and no env actor
up: "buffer waiting for 1 slot leased to env_actor1 (...)"). RUN_DIR defaults to the newest run under runs/. Without a launcher state (roles run by
systemd) the roles and ports come from the configuration: the `key=value` overrides, as the
units' EMPO2_ARGS. `--json` prints the same as one JSON object. A RUN_DIR that is not a run's
directory (missing, or without launch/state.json, summary.json or heartbeats/) is refused: one line,
exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from common.metrics import (
    ENV_ACTOR_ENV_STEPS,
    ENV_ACTOR_MEMORY_FALLBACKS,
    LEARNER_STALENESS_MEAN_VERSIONS,
    LEARNER_STEP_SECONDS,
    LEARNER_STEPS,
    LEARNER_TOKENS,
    MEMORY_SERVICE_ENTRIES,
    MEMORY_SERVICE_RETRIEVAL_HITS,
    POLICY_SERVER_GENERATED_TOKENS,
    REPLAY_BUFFER_GROUPS_OPEN,
    REPLAY_BUFFER_GROUPS_READY,
    REPLAY_BUFFER_LEASE_RENEWED_AT,
    REPLAY_BUFFER_OPEN_SLOTS,
    REPLAY_BUFFER_TRAJECTORIES_ACCEPTED,
)
from deploy.monitor import scrape, total
from deploy.run_state import newest_run, not_a_run, read_finished, read_state

# counters whose rates the status shows: (label, role kind, metric)
RATES = [
    ("episodes/s", "replay_buffer", REPLAY_BUFFER_TRAJECTORIES_ACCEPTED),
    ("env steps/s", "env_actor", ENV_ACTOR_ENV_STEPS),
    ("generated tokens/s", "policy_server", POLICY_SERVER_GENERATED_TOKENS),
    ("learner tokens/s", "learner", LEARNER_TOKENS),
]


# A lease whose holder has not renewed it for this long has stopped renewing: its process is gone or
# hung (env_actor.lease_renew_s is 20 s by default; replay_buffer.lease_ttl_s, 120 s, then frees the slot).
STALE_RENEWAL_S = 60.0


def _by_label(samples: dict[str, float], metric: str, label: str) -> dict[str, float]:
    """metric{label="x"} -> {x: value}."""
    prefix = f"{metric}{{{label}="
    return {k[len(prefix) :].split('"')[1]: v for k, v in samples.items() if k.startswith(prefix)}


def actor_process(actor_id: str) -> str:
    """The run's process name of an env actor's id: actor1, or actor1.2 (its third env): env_actor1."""
    base = actor_id.split(".", 1)[0]
    return f"env_{base}" if base.startswith("actor") else actor_id


def pipeline_waits(buffer: dict[str, float], up: dict[str, bool], now: float) -> dict:
    """What the buffer's open groups wait for (its open_slots and lease_renewed_at gauges, by the actor
    holding each slot's lease) and, when the pipeline starves, why: slots leased to an env actor that is
    down or has not renewed them for STALE_RENEWAL_S, or free slots with no env actor up. `up`: each
    process name's state. Without a buffer scrape, nothing."""
    if not buffer:
        return {"slots": {}, "stall": None}
    slots, renewed = (
        _by_label(buffer, REPLAY_BUFFER_OPEN_SLOTS, "holder"),
        _by_label(buffer, REPLAY_BUFFER_LEASE_RENEWED_AT, "holder"),
    )
    waits, stalls = {}, []
    actors_up = any(state for name, state in up.items() if name.startswith("env_actor"))
    for holder, n in sorted(slots.items()):
        if not n:
            continue
        if holder == "none":
            waits["free"] = {"slots": n}
            if not actors_up:
                stalls.append(f"{n:g} free slot{'s' * (n != 1)} and no env actor up")
            continue
        name = actor_process(holder)
        age = now - renewed[holder] if holder in renewed else None
        waits[holder] = {"slots": n, "process": name, "renewed_s_ago": None if age is None else round(age, 1)}
        why = []
        if up.get(name) is False:
            why.append(f"{name} is down")
        if age is not None and age > STALE_RENEWAL_S:
            why.append(f"lease last renewed {age:.0f} s ago")
        if why:
            stalls.append(
                f"{n:g} slot{'s' * (n != 1)} leased to {name} ({', '.join(why)}): handed out again when the lease "
                f"lapses (replay_buffer.lease_ttl_s) or at once when {name} restarts"
            )
    stall = None
    if stalls:
        ready = buffer.get(REPLAY_BUFFER_GROUPS_READY, 0.0)
        stall = f"buffer waiting for {'; '.join(stalls)}; {ready:g} groups ready for the learner"
    return {"groups_open": buffer.get(REPLAY_BUFFER_GROUPS_OPEN), "slots": waits, "stall": stall}


def roles_from_config(overrides: list[str]) -> list[dict]:
    """The roles a configuration runs, with their metrics endpoints (no launcher state)."""
    from pipeline.config import load_config
    from pipeline.roles import run_roles

    cfg = load_config(overrides)
    m = cfg.metrics
    return [
        {"name": r.name, "kind": r.kind, "metrics": f"{m.host}:{m.port(r.kind, r.index)}", "log": None}
        for r in run_roles(cfg)
    ]


def last_error(log: str | None, lines: int = 400) -> str | None:
    """The last ERROR or Traceback line of a role's log (common/logs.py's format), if any."""
    if not log:
        return None
    try:
        tail = Path(log).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return None
    errors = [line for line in tail if " ERROR " in line or line.startswith(("Traceback", "RuntimeError"))]
    return errors[-1][:200] if errors else None


def _scrape(roles: list[dict]) -> dict[str, dict[str, float]]:
    out = {}
    for r in roles:
        host, port = r["metrics"].rsplit(":", 1)
        out[r["name"]] = scrape(host, int(port), timeout_s=1.0)
    return out


def status(roles: list[dict], interval_s: float) -> dict:
    first = _scrape(roles)
    t0 = time.monotonic()
    time.sleep(interval_s)
    second = _scrape(roles)
    dt = time.monotonic() - t0
    kinds = {r["name"]: r["kind"] for r in roles}
    per_role = {}
    for r in roles:
        s = second[r["name"]]
        errors = {k.split('where="')[1].rstrip('"}'): v for k, v in s.items() if "_errors_total{" in k and v}
        per_role[r["name"]] = {
            "up": bool(s),
            "restarts": r.get("restarts", 0),
            "hung": r.get("restart_reasons", {}).get("hung", 0),  # of the restarts: no heartbeat
            "last_exit": r.get("last_exit"),
            "policy_version": next((v for k, v in s.items() if k.endswith("_policy_version")), None),
            "errors": errors,
            "last_error": last_error(r.get("log")),
        }

    def summed(samples: dict[str, dict[str, float]], kind: str, metric: str) -> float:
        return sum(total(v, metric) for name, v in samples.items() if kinds[name] == kind)

    rates = {}
    for label, kind, metric in RATES:
        # a role that restarted between the scrapes starts its counters again: no negative rates
        rates[label] = round(max(summed(second, kind, metric) - summed(first, kind, metric), 0.0) / dt, 3)
    steps = summed(second, "learner", LEARNER_STEPS)
    step_count = summed(second, "learner", f"{LEARNER_STEP_SECONDS}_count")
    buffer = next((second[name] for name, kind in kinds.items() if kind == "replay_buffer"), {})
    waits = pipeline_waits(buffer, {name: r["up"] for name, r in per_role.items()}, time.time())
    hits, queries = (
        summed(second, "memory_service", f"{MEMORY_SERVICE_RETRIEVAL_HITS}_sum"),
        summed(second, "memory_service", f"{MEMORY_SERVICE_RETRIEVAL_HITS}_count"),
    )
    return {
        "roles": per_role,
        "rates": rates,
        "learner_step": steps,
        "seconds_per_step": round(summed(second, "learner", f"{LEARNER_STEP_SECONDS}_sum") / step_count, 1)
        if step_count
        else None,
        "buffer_groups_ready": summed(second, "replay_buffer", REPLAY_BUFFER_GROUPS_READY),
        "staleness_mean_versions": summed(second, "learner", LEARNER_STALENESS_MEAN_VERSIONS),
        "memory_entries": summed(second, "memory_service", MEMORY_SERVICE_ENTRIES),
        "memory_hits_per_query": round(hits / queries, 2) if queries else None,
        "memory_fallbacks": summed(second, "env_actor", ENV_ACTOR_MEMORY_FALLBACKS),
        "pipeline": waits,
    }


def render(report: dict, source: str) -> str:
    lines = [f"EMPO2 status ({source})", ""]
    lines.append(f"{'role':<16} {'state':<6} {'restarts':>8} {'last exit':>9} {'version':>7}  errors / last error")
    for name, r in report["roles"].items():
        version = "-" if r["policy_version"] is None else f"{r['policy_version']:.0f}"
        last_exit = "-" if r["last_exit"] is None else str(r["last_exit"])
        errors = ", ".join(f"{k} {v:.0f}" for k, v in r["errors"].items())
        hung = f"restarted hung {r['hung']}" if r.get("hung") else ""
        detail = "  ".join(x for x in (hung, errors, r["last_error"] or "") if x)
        state = "up" if r["up"] else "DOWN"
        lines.append(f"{name:<16} {state:<6} {r['restarts']:>8} {last_exit:>9} {version:>7}  {detail}")
    lines.append("")
    lines.append("  ".join(f"{k} {v:g}" for k, v in report["rates"].items()))
    per_step = report["seconds_per_step"]
    lines.append(
        f"learner step {report['learner_step']:.0f} ({'-' if per_step is None else per_step} s/step)  "
        f"buffer groups ready {report['buffer_groups_ready']:.0f}  staleness {report['staleness_mean_versions']:.2f}  "
        f"memory entries {report['memory_entries']:.0f}, hits/query {report['memory_hits_per_query']}, "
        f"fallbacks {report['memory_fallbacks']:.0f}"
    )
    waits = report.get("pipeline") or {}
    if waits.get("slots"):
        held = ", ".join(
            f"{w['slots']:g} free" if key == "free" else f"{w['slots']:g} leased to {w['process']}"
            for key, w in waits["slots"].items()
        )
        lines.append(f"open groups {waits.get('groups_open') or 0:g}: unfilled slots {held}")
    if waits.get("stall"):
        lines.append(f"STALL: {waits['stall']}")
    return "\n".join(lines)


# what a finished run's screen shows of its summary (deploy/launch.py main): (label, key)
SUMMARY_LINES = [
    ("learner steps", "learner_steps"),
    ("server versions at the end", "server_versions_at_end"),
    ("wall seconds", "wall_seconds"),
    ("episodes", "episodes"),
    ("env steps", "env_steps"),
    ("memory entries", "memory_entries"),
    ("reflections", "reflections"),
    ("tips shown", "tips_shown"),
    ("mean episode score", "mean_episode_score"),
    ("step seconds", "step_seconds"),
    ("weight push seconds", "weight_push_seconds"),
    ("final checkpoint", "final_checkpoint"),
]


def finished_report(state: dict, finished: dict) -> dict:
    """A run that has ended: how (outcome, exit status, final version, when), its summary, and each
    role's restarts and exit status when the launcher stopped it, with its log's last error."""
    roles = {
        name: {
            "up": False,
            "restarts": r.get("restarts", 0),
            "last_exit": r.get("last_exit"),
            "exit": r.get("exit"),
            "last_error": last_error(r.get("log")),
        }
        for name, r in state.get("roles", {}).items()
    }
    summary = finished.pop("summary_data")
    return {"finished": finished, "summary": summary, "roles": roles}


def render_finished(report: dict, source: str) -> str:
    f, summary = report["finished"], report["summary"]
    exit_status = "unknown" if f["exit_status"] is None else f["exit_status"]
    version = "-" if f["policy_version"] is None else f["policy_version"]
    ended = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f["at"]))
    lines = [
        f"EMPO2 status ({source})",
        "",
        f"run finished: {f['outcome']}, exit status {exit_status}, at {ended}; final policy version {version}",
        f"summary ({f['summary']}):",
    ]
    lines += [f"  {label}: {summary[key]}" for label, key in SUMMARY_LINES if summary.get(key) is not None]
    lines.append("")
    lines.append(f"{'role':<16} {'state':<8} {'restarts':>8} {'last exit':>9} {'exit':>5}  last error")
    for name, r in report["roles"].items():
        last_exit = "-" if r["last_exit"] is None else str(r["last_exit"])
        exit_ = "-" if r["exit"] is None else str(r["exit"])
        lines.append(f"{name:<16} {'stopped':<8} {r['restarts']:>8} {last_exit:>9} {exit_:>5}  {r['last_error'] or ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="empo2-status", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?", type=Path, help="default: the newest run under runs/")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) when there is no launcher state")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between the two scrapes (rates)")
    args = parser.parse_intermixed_args(argv)  # options may come between the positionals
    if args.run_dir is not None and "=" in str(args.run_dir):  # only overrides were given
        args.overrides, args.run_dir = [str(args.run_dir), *args.overrides], None
    problem = None if args.run_dir is None else not_a_run(args.run_dir)
    if problem:  # not the roles' default ports, all of them down: a run dir mistyped says so
        print(f"empo2-status: {problem}", file=sys.stderr)
        return 2
    run_dir = args.run_dir or newest_run()
    state = read_state(run_dir) if run_dir else {}
    finished = read_finished(run_dir, state) if state else None
    if finished is not None:
        source = f"launcher state {run_dir / 'launch' / 'state.json'}"
        report = finished_report(state, finished)
        print(json.dumps({"source": source, **report}, indent=1) if args.json else render_finished(report, source))
        return 0
    if state:
        roles, source = list(state["roles"].values()), f"launcher state {run_dir / 'launch' / 'state.json'}"
    else:
        roles, source = roles_from_config(args.overrides), "configured ports (no launcher state)"
    report = status(roles, args.interval)
    print(json.dumps({"source": source, **report}, indent=1) if args.json else render(report, source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
