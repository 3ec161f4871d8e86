"""benchmarks/chaos.py without processes: the seeded schedule, and the audit's checks on hand-made samples;
testing/harness.episode_audit on a hand-written buffer log and actor logs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import chaos
from protocol.codec import encode
from replay_buffer.buffer import BufferLog
from replay_buffer.config import Durability
from testing.factories import make_traj
from testing.harness import episode_audit


def _row(t: float, **roles) -> dict:
    return {"t": t, "roles": roles}


def test_the_schedule_comes_from_the_seed_alone_within_the_gaps():
    a = chaos.schedule(3, 10, (30, 90), (5, 30))
    assert a == chaos.schedule(3, 10, (30, 90), (5, 30)) and a != chaos.schedule(4, 10, (30, 90), (5, 30))
    gaps = [y.at_s - x.at_s for x, y in zip(a, a[1:])]
    assert all(29.9 <= g <= 90.1 for g in gaps) and a[-1].at_s < 600
    assert {f.kind for f in a} <= {"kill", "stop"} and all(5 <= f.stop_s <= 30 for f in a)


def test_a_server_serving_an_older_version_after_a_newer_one_is_a_regression():
    server = lambda v, tok: {"version": v, "tokens": tok}  # noqa: E731
    fine = [_row(0, policy_server0=server(0, 10)), _row(1, policy_server0=server(3, 20)),
            _row(2, policy_server0=server(0, 0)),  # restarted: not serving yet at version 0
            _row(3, policy_server0=server(3, 5))]  # fmt: skip
    assert chaos.version_regressions(fine) == []
    rolled_back = [*fine, _row(4, policy_server0=server(2, 0)), _row(5, policy_server0=server(2, 9))]
    assert chaos.version_regressions(rolled_back) == ["policy_server0 at t=5s served version 2 after 3"]


def test_memory_entries_must_survive_a_kill_and_time_to_recover_is_until_the_new_process_answers():
    kill = chaos.Injected(at_s=10, kind="kill", role="memory_service", stop_s=0)
    mem = lambda e, pid, answers=True: {"entries": e, "pid": pid, "answers": answers}  # noqa: E731
    rows = [_row(9, memory_service=mem(7, 1)), _row(12, memory_service=mem(None, 2, False)),
            _row(15, memory_service=mem(7, 2))]  # fmt: skip
    assert chaos.memory_losses([kill], rows) == []
    lost = [*rows[:2], _row(15, memory_service=mem(5, 2))]
    assert chaos.memory_losses([kill], lost) == ["memory entries 7 before the kill at t=10s, 5 after"]
    chaos.recovery([kill], rows)
    assert kill.recovered_s == 5  # t=15: a new pid whose metrics answer


def test_rss_growth_is_judged_between_the_first_and_the_last_third():
    rows = [_row(t, learner={"rss_mb": 1000.0 + 10 * t}) for t in range(0, 91, 10)]
    assert chaos.rss_peaks(rows) == {"learner": {"first": 1200.0, "last": 1900.0}}


def test_the_learner_is_judged_by_its_memory_after_each_step_not_by_its_peak(tmp_path):
    """A late step that fills a micro-batch raises the learner's peak, not its floor; a leak raises both."""
    metrics = tmp_path / "metrics.jsonl"
    records = [{"record": "eval"}] + [
        {"record": "step", "resident_mb": mb} for mb in (3000, 3100, 3050, 3000, 3100, 3080)
    ]
    metrics.write_text("\n".join(json.dumps(r) for r in records))
    floors = chaos.learner_floors(metrics)
    assert floors == {"first": 3100, "last": 3100}
    peaks = {"learner": floors, "env_actor0": {"first": 900.0, "last": 2000.0}}
    assert chaos.rss_growth(peaks) == ["env_actor0: 900 MB -> 2000 MB"]
    leaking = [{"record": "step", "resident_mb": 3000 + 1000 * i} for i in range(6)]
    metrics.write_text("\n".join(json.dumps(r) for r in leaking))
    assert chaos.rss_growth({"learner": chaos.learner_floors(metrics)}) == ["learner: 4000 MB -> 8000 MB"]
    assert chaos.learner_floors(tmp_path / "missing.jsonl") == {} and chaos.rss_growth({"learner": {}}) == []


def test_the_episode_audit_finds_what_was_logged_twice_or_acknowledged_and_not_logged(tmp_path):
    (tmp_path / "logs").mkdir()
    log = BufferLog(tmp_path / "buffer.log", Durability.flush)
    trajectories = [make_traj("g", slot) for slot in range(3)]
    for t in [*trajectories, trajectories[1]]:
        log.append_trajectory(encode(t))
    log.append_served("g")
    log.close()
    ids = [t.episode_id for t in trajectories]
    (tmp_path / "logs" / "env_actor0.log").write_text(
        "".join(f"episode {e} of group g acknowledged\n" for e in [*ids, "lost"])
    )
    cfg = SimpleNamespace(
        run_dir=str(tmp_path),
        replay_buffer=SimpleNamespace(log_file="buffer.log"),
        run_path=lambda name: Path(tmp_path) / name,
    )
    audit = episode_audit(cfg)
    assert audit == {
        "logged": 4,
        "acknowledged": 4,
        "logged_twice": [ids[1]],
        "groups_used_twice": [],
        "acknowledged_not_logged": ["lost"],
        "skipped_records": 0,
    }


@pytest.mark.e2e
@pytest.mark.long
def test_a_short_soak_ends_at_its_target_with_a_clean_audit(tmp_path):
    """The soak's short variant (`make test-long`; the soak itself is a benchmark of >= 30 min): profile=e2e
    with two policy servers, a fault every 20-40 s from a fixed seed until the learner reaches 6 steps,
    then the whole audit must be clean."""
    out = tmp_path / "chaos.json"
    argv = ["--profile", "e2e", "--steps", "6", "--minutes", "6", "--gap", "20", "40", "--seed", "1"]
    rc = chaos.main([*argv, "--run-dir", str(tmp_path), "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["faults"], result  # the soak injected something before the run ended
    assert out.with_suffix(".png").exists()
    audit = result["audit"]
    # the RSS too: an env actor's ScienceWorld JVM grew 1.25 -> 2.25 GB in this run before env.jvm_max_heap_mb
    assert rc == 0 and result["clean"], json.dumps(audit, indent=1)


def test_actor_kills_hit_every_phase_of_a_group_in_turn():
    faults = chaos.schedule(5, 60, (20, 40), (5, 30), actor_kills=0.5, group_size=4)
    kills = [f for f in faults if f.kind == "actor_kill"]
    assert len(kills) >= 8 and [f.phase for f in kills][:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    plain = chaos.schedule(5, 60, (20, 40), (5, 30))  # the default: no actor kills, the same seed's schedule
    assert plain == chaos.schedule(5, 60, (20, 40), (5, 30), actor_kills=0.0)
    assert all(f.kind != "actor_kill" for f in plain)


def _learner(steps: float) -> dict:
    return {"steps": steps}


def test_liveness_finds_a_window_without_a_step_after_the_last_fault():
    # a step every 10 s, a fault at t=35; then steps at 40, 50 and (a stall) 120
    steady = [_row(t, learner=_learner(t // 10)) for t in range(0, 60)]
    kill = chaos.Injected(at_s=35, kind="actor_kill", role="env_actor1", stop_s=0)
    assert chaos.step_times(steady)[:3] == [10, 20, 30]
    assert chaos.liveness([kill], steady) == []
    stalled = [*steady, *(_row(t, learner=_learner(5)) for t in range(60, 120)), _row(120, learner=_learner(6))]
    assert chaos.liveness([kill], stalled) == [
        "no learner step from t=50s to t=120s (70s, bound 40s: 4 x the median step gap)"
    ]
    chaos.next_steps([kill], stalled)
    assert kill.next_step_s == 5  # t=40, 5 s after the kill
    # no step at all after the last fault, for longer than the bound
    dead = [*steady[:36], *(_row(t, learner=_learner(3)) for t in range(36, 100))]
    assert chaos.liveness([kill], dead) == ["no learner step in the 64s after the last fault (bound 40s)"]


def test_the_leftover_scan_sees_only_the_marked_runs_processes(monkeypatch):
    """A process is the run's when its environment holds the run's mark (inherited from the launcher)."""
    import subprocess
    import sys

    from testing import harness

    monkeypatch.setattr(harness, "LEFTOVER_NAMES", harness.re.compile(r"python", harness.re.I))
    marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                              env={**__import__("os").environ, harness.RUN_MARK_ENV: "soak-a"})  # fmt: skip
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mine = harness.leftover_processes("soak-a")
        assert marked.pid in mine and other.pid not in mine
        assert {marked.pid, other.pid} <= set(harness.leftover_processes())  # unmarked: the whole machine
    finally:
        for p in (marked, other):
            p.kill()
            p.wait()
