"""benchmarks/chaos.py without processes: the seeded schedule, and the audit's checks on hand-made samples;
deploy/harness.episode_audit on a hand-written buffer log and actor logs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import chaos
from deploy.harness import episode_audit
from protocol.codec import encode
from replay_buffer.buffer import BufferLog
from replay_buffer.config import Durability
from tests.factories import make_traj


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
