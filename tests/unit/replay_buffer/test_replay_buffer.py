"""replay_buffer.buffer: group assignment, leases, mode draws, batching, staleness and the log;
replay_buffer.service: the process's checks and its handler table.

No ScienceWorld: the buffer gets a hand-made {task: [train variations]} dict.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from protocol.codec import DEFAULT_MAX_MESSAGE_BYTES, encode
from protocol.messages import MODES, OFF_POLICY, ON_POLICY, ON_POLICY_TIPS, Assignment
from replay_buffer.buffer import BufferLog, ReplayBuffer, draw_mode
from replay_buffer.config import Durability
from testing.factories import VARIATIONS, make_buffer, make_cfg, make_traj, open_group, traj_for


def take(buffer: ReplayBuffer, learner_version: int, num_groups: int, max_staleness: int, now: float = 0.0):
    """take_batch with the learner's default limit, confirmed at once: (groups used, groups stale)."""
    batch, stale = buffer.take_batch(learner_version, num_groups, max_staleness, DEFAULT_MAX_MESSAGE_BYTES, now)
    if batch is None:
        return [], stale
    assert buffer.confirm(batch.batch_id) == batch.group_ids
    return batch.groups, stale


def complete_group(buffer: ReplayBuffer, versions: tuple[int, ...] = (5, 5), now: float = 0.0) -> str:
    assignments = open_group(buffer, now)
    for a in assignments:
        assert buffer.add(traj_for(a, versions=versions))
    return assignments[0].group_id


# ----------------------------------------------------------------------------- assignment


def test_targets_are_the_first_variations_of_each_configured_task():
    buffer = make_buffer()
    assert buffer.targets == [("boil", 4), ("boil", 9), ("melt", 1), ("melt", 2)]


def test_no_targets_is_a_value_error():
    with pytest.raises(ValueError):
        ReplayBuffer(make_cfg(tasks=["boil"]), {"boil": []}, seed=0)


def test_a_group_is_g_slots_sharing_task_variation_and_mode():
    buffer = make_buffer(group_size=3)
    results = [buffer.assign(0.0) for _ in range(3)]
    assert [reissued for _, reissued in results] == [False, False, False]
    slots = [a for a, _ in results]
    assert [a.slot for a in slots] == [0, 1, 2]
    assert len({a.group_id for a in slots}) == 1
    assert {(a.task, a.variation) for a in slots} == {("boil", 4)}
    assert len({a.mode for a in slots}) == 1 and slots[0].mode in MODES
    assert all(0 <= a.seed < 2**31 for a in slots)
    nxt, reissued = buffer.assign(0.0)
    assert nxt.group_id != slots[0].group_id and nxt.slot == 0 and not reissued
    assert (nxt.task, nxt.variation) == ("boil", 9)


def test_new_groups_cycle_through_the_targets():
    buffer = make_buffer(group_size=1, max_open_groups=100)
    targets = [(a.task, a.variation) for a in (buffer.assign(0.0)[0] for _ in range(5))]
    assert targets == [("boil", 4), ("boil", 9), ("melt", 1), ("melt", 2), ("boil", 4)]


def test_max_open_groups_bound_returns_none_until_a_group_completes():
    buffer = make_buffer(group_size=2, max_open_groups=2)
    handed = [buffer.assign(0.0)[0] for _ in range(4)]
    assert len({a.group_id for a in handed}) == 2
    assert buffer.assign(1.0) == (None, False)
    assert buffer.assign(2.0) == (None, False)
    for a in handed[:2]:
        assert buffer.add(traj_for(a))
    new, reissued = buffer.assign(3.0)
    assert new is not None and not reissued
    assert new.group_id not in {a.group_id for a in handed}


def test_expired_leases_are_reissued_and_live_ones_are_not():
    buffer = make_buffer(group_size=2, max_open_groups=1, assignment_timeout_s=10.0)
    first, _ = buffer.assign(0.0)
    second, _ = buffer.assign(1.0)
    assert buffer.assign(5.0) == (None, False)
    assert buffer.assign(10.0) == (None, False)  # exactly the timeout: still live
    again, reissued = buffer.assign(10.5)
    assert reissued and (again.group_id, again.slot) == (first.group_id, 0)
    assert again.mode == first.mode and (again.task, again.variation) == (first.task, first.variation)
    assert buffer.assign(10.6) == (None, False)  # slot 1 leased at 1.0: live until 11.0
    again, reissued = buffer.assign(11.5)
    assert reissued and (again.group_id, again.slot) == (second.group_id, 1)
    assert buffer.assign(12.0) == (None, False)  # both re-leased


def test_filled_slots_are_never_reissued():
    buffer = make_buffer(group_size=2, max_open_groups=1, assignment_timeout_s=10.0)
    first, _ = buffer.assign(0.0)
    buffer.assign(0.0)
    assert buffer.add(traj_for(first))
    again, reissued = buffer.assign(100.0)
    assert reissued and again.slot == 1
    assert buffer.assign(100.0) == (None, False)


def test_a_returned_slot_is_handed_out_again_at_once():
    buffer = make_buffer(group_size=2, max_open_groups=1, assignment_timeout_s=10.0)
    first, _ = buffer.assign(0.0)
    second, _ = buffer.assign(0.0)
    assert buffer.assign(1.0) == (None, False)
    assert buffer.release(second.group_id, second.slot)
    again, reissued = buffer.assign(1.0)  # long before the lease timeout, and not counted as a re-issue
    assert (again.group_id, again.slot, reissued) == (second.group_id, 1, False)
    assert buffer.add(traj_for(first))
    assert not buffer.release(first.group_id, first.slot)  # filled: nothing to give back
    assert not buffer.release("no-such-group", 0)
    assert buffer.assign(1.0) == (None, False)


# ------------------------------------------------------------------------------ mode draw


@pytest.mark.parametrize("p, q", [(0.25, 0.68), (0.6, 0.3)])
def test_draw_mode_frequencies_match_p_and_q(p, q):
    rng = random.Random(1234)
    n = 20000
    counts = Counter(draw_mode(rng, p, q) for _ in range(n))
    assert set(counts) <= set(MODES)
    assert counts[ON_POLICY] / n == pytest.approx(1 - p, abs=0.02)
    assert counts[OFF_POLICY] / n == pytest.approx(p * q, abs=0.02)
    assert counts[ON_POLICY_TIPS] / n == pytest.approx(p * (1 - q), abs=0.02)


@pytest.mark.parametrize(
    "p, q, only",
    [(0.0, 0.5, ON_POLICY), (0.0, 1.0, ON_POLICY), (1.0, 0.0, ON_POLICY_TIPS), (1.0, 1.0, OFF_POLICY)],
)
def test_draw_mode_extremes_give_a_single_mode(p, q, only):
    rng = random.Random(7)
    assert {draw_mode(rng, p, q) for _ in range(2000)} == {only}


def test_group_modes_follow_the_configured_p():
    buffer = make_buffer(group_size=1, max_open_groups=100, p_memory=0.0)
    assert {buffer.assign(0.0)[0].mode for _ in range(50)} == {ON_POLICY}
    buffer = make_buffer(group_size=1, max_open_groups=100, p_memory=1.0, q_off_policy=1.0)
    assert {buffer.assign(0.0)[0].mode for _ in range(50)} == {OFF_POLICY}


def test_same_seed_gives_the_same_assignments():
    def run(seed):
        buffer = make_buffer(seed=seed, group_size=1, max_open_groups=100)
        return [(a.mode, a.seed) for a in (buffer.assign(0.0)[0] for _ in range(20))]

    assert run(3) == run(3)
    assert run(3) != run(4)


# ------------------------------------------------------------------------------------ add


def test_duplicate_episode_id_is_rejected():
    buffer = make_buffer()
    a0, a1, _ = open_group(buffer)
    assert buffer.add(traj_for(a0, episode_id="ep"))
    assert not buffer.add(traj_for(a1, episode_id="ep"))
    assert sorted(buffer.open[a0.group_id].trajectories) == [0]


def test_already_filled_slot_is_rejected():
    buffer = make_buffer()
    a0, _, _ = open_group(buffer)
    assert buffer.add(traj_for(a0, episode_id="first"))
    assert not buffer.add(traj_for(a0, episode_id="second"))
    assert buffer.open[a0.group_id].trajectories[0].episode_id == "first"
    assert "second" not in buffer.episode_ids


def test_wrong_mode_for_the_group_is_rejected():
    buffer = make_buffer()
    a0, _, _ = open_group(buffer)
    other = next(m for m in MODES if m != a0.mode)
    bad = make_traj(a0.group_id, 0, task=a0.task, variation=a0.variation, mode=other)
    assert not buffer.add(bad)
    assert buffer.open[a0.group_id].trajectories == {}
    assert buffer.add(traj_for(a0))  # the slot is still free for the right mode


@pytest.mark.parametrize("slot", [3, 99])  # a negative slot never decodes (Trajectory.validate)
def test_out_of_range_slot_of_a_known_group_is_rejected(slot):
    buffer = make_buffer(group_size=3)
    a0, _, _ = open_group(buffer)
    bad = make_traj(a0.group_id, slot, task=a0.task, variation=a0.variation, mode=a0.mode)
    assert not buffer.add(bad)
    assert buffer.open[a0.group_id].trajectories == {}
    assert bad.episode_id not in buffer.episode_ids


def test_rejected_trajectory_of_an_unknown_group_leaves_no_open_group():
    buffer = make_buffer(group_size=3, max_open_groups=1)
    assert not buffer.add(make_traj("stray-group", 7, task="unused", variation=0))
    assert "stray-group" not in buffer.open
    assignment, _ = buffer.assign(0.0)
    assert assignment.group_id != "stray-group"


def test_group_becomes_ready_only_when_complete():
    buffer = make_buffer(group_size=3)
    a0, a1, a2 = open_group(buffer)
    gid = a0.group_id
    assert buffer.add(traj_for(a0)) and buffer.add(traj_for(a2))
    assert gid in buffer.open and gid not in buffer.ready
    assert take(buffer, 5, 1, 4) == ([], [])
    assert buffer.add(traj_for(a1))
    assert gid in buffer.ready and gid not in buffer.open
    assert sorted(buffer.ready[gid].trajectories) == [0, 1, 2]


def test_trajectory_of_an_unknown_group_opens_it_and_its_other_slots_are_assigned():
    buffer = make_buffer(group_size=2, max_open_groups=1)
    assert buffer.add(make_traj("from-before-restart", 1, task="melt", variation=2, mode=OFF_POLICY))
    group = buffer.open["from-before-restart"]
    assert (group.task, group.variation, group.mode) == ("melt", 2, OFF_POLICY)
    assignment, reissued = buffer.assign(0.0)
    assert (assignment.group_id, assignment.slot, assignment.mode) == ("from-before-restart", 0, OFF_POLICY)
    assert not reissued
    assert buffer.assign(0.0) == (None, False)


def test_trajectory_of_a_served_group_is_rejected():
    buffer = make_buffer(group_size=2)
    gid = complete_group(buffer)
    batch, _ = take(buffer, 5, 1, 4)
    assert [g.group_id for g in batch] == [gid]
    late = make_traj(gid, 0, episode_id="late")
    assert not buffer.add(late)
    assert gid not in buffer.open and gid not in buffer.ready


# ----------------------------------------------------------------------------- take_batch


def test_take_batch_serves_only_full_batches():
    buffer = make_buffer(group_size=2, max_open_groups=4)
    first = complete_group(buffer)
    assert take(buffer, 5, 2, 4) == ([], [])
    assert list(buffer.ready) == [first]  # still waiting
    second = complete_group(buffer)
    batch, stale = take(buffer, 5, 2, 4)
    assert [g.group_id for g in batch] == [first, second] and stale == []
    assert buffer.ready == {} and buffer.served == {first, second}
    assert take(buffer, 5, 1, 4) == ([], [])


def test_take_batch_serves_oldest_complete_groups_first():
    buffer = make_buffer(group_size=2, max_open_groups=4)
    a, b, c = (complete_group(buffer) for _ in range(3))
    batch, _ = take(buffer, 5, 2, 4)
    assert [g.group_id for g in batch] == [a, b]
    assert list(buffer.ready) == [c]
    batch, _ = take(buffer, 5, 1, 4)
    assert [g.group_id for g in batch] == [c]


def test_groups_are_ordered_by_completion_not_by_creation():
    buffer = make_buffer(group_size=2, max_open_groups=4)
    early = open_group(buffer)
    late = open_group(buffer)
    for a in late + early:
        assert buffer.add(traj_for(a))
    batch, _ = take(buffer, 5, 2, 4)
    assert [g.group_id for g in batch] == [late[0].group_id, early[0].group_id]


def test_batch_holds_every_trajectory_of_each_group():
    buffer = make_buffer(group_size=3)
    gid = complete_group(buffer)
    (group,), _ = take(buffer, 5, 1, 4)
    assert group.group_id == gid
    assert sorted(group.trajectories) == [0, 1, 2]
    assert {t.episode_id for t in group.trajectories.values()} == {f"{gid}-{s}" for s in range(3)}


def test_stale_groups_are_dropped_and_never_served_later():
    buffer = make_buffer(group_size=2, max_open_groups=4)
    old = complete_group(buffer, versions=(1, 6))  # oldest turn: version 1
    edge = complete_group(buffer, versions=(2, 2))  # exactly max_staleness behind: kept
    fresh = complete_group(buffer, versions=(6, 6))
    batch, stale = take(buffer, learner_version=6, num_groups=2, max_staleness=4)
    assert [g.group_id for g in stale] == [old]
    assert [g.group_id for g in batch] == [edge, fresh]
    assert old in buffer.served and old not in buffer.ready
    assert take(buffer, 6, 1, 4) == ([], [])
    assert not buffer.add(make_traj(old, 0, episode_id="retry"))


def test_stale_groups_are_dropped_even_when_no_batch_is_served():
    buffer = make_buffer(group_size=2, max_open_groups=4)
    old = complete_group(buffer, versions=(0, 0))
    fresh = complete_group(buffer, versions=(9, 9))
    batch, stale = take(buffer, learner_version=10, num_groups=2, max_staleness=3)
    assert batch == [] and [g.group_id for g in stale] == [old]
    assert list(buffer.ready) == [fresh]
    batch, stale = take(buffer, learner_version=10, num_groups=1, max_staleness=3)
    assert [g.group_id for g in batch] == [fresh] and stale == []


def test_oldest_version_is_the_minimum_over_all_turns_of_the_group():
    buffer = make_buffer(group_size=2)
    a0, a1 = open_group(buffer)
    buffer.add(traj_for(a0, versions=(8, 9)))
    buffer.add(traj_for(a1, versions=(7, 3, 9)))
    assert buffer.ready[a0.group_id].oldest_version == 3


# ------------------------------------------------------------------------------ BufferLog


@pytest.fixture
def log_path(tmp_path) -> Path:
    return tmp_path / "buffer.log"


@pytest.fixture
def open_log():
    logs: list[BufferLog] = []

    def make(path: Path) -> BufferLog:
        log = BufferLog(path, Durability.flush)
        logs.append(log)
        return log

    yield make
    for log in logs:
        log.file.close()


def _play(buffer: ReplayBuffer, log: BufferLog) -> dict[str, str]:
    """What BufferProcess does: A and C complete, A served, B half done."""
    ids = {}
    for name in ("A", "B", "C"):
        assignments = open_group(buffer)
        ids[name] = assignments[0].group_id
        for a in assignments if name != "B" else assignments[:1]:
            traj = traj_for(a)
            assert buffer.add(traj)
            log.append_trajectory(encode(traj))
    batch, stale = take(buffer, 5, 1, 4)
    assert [g.group_id for g in batch] == [ids["A"]] and stale == []
    log.append_served(ids["A"])
    return ids


def test_replay_restores_ready_and_open_groups_and_skips_served_ones(log_path, open_log):
    live = make_buffer(group_size=2, max_open_groups=3)
    log = open_log(log_path)
    ids = _play(live, log)
    log.file.close()

    restored = make_buffer(group_size=2, max_open_groups=3)
    assert BufferLog.replay(log_path, restored).records == 6  # 5 trajectories + 1 served record
    assert list(restored.ready) == [ids["C"]]
    assert list(restored.open) == [ids["B"]]
    assert sorted(restored.open[ids["B"]].trajectories) == [0]
    assert ids["A"] in restored.served
    assert restored.episode_ids == live.episode_ids
    # groups keep their mode and content
    for gid in (ids["B"], ids["C"]):
        live_group = live.open.get(gid) or live.ready[gid]
        restored_group = restored.open.get(gid) or restored.ready[gid]
        assert restored_group.mode == live_group.mode
        assert (restored_group.task, restored_group.variation) == (live_group.task, live_group.variation)
    # A is never served again; C is
    batch, stale = take(restored, 5, 1, 4)
    assert [g.group_id for g in batch] == [ids["C"]] and stale == []
    assert take(restored, 5, 1, 4) == ([], [])
    # actors re-sending what was acknowledged before the restart are deduplicated
    assert not restored.add(make_traj(ids["A"], 1))
    assert not restored.add(live.open[ids["B"]].trajectories[0])


def test_replayed_trajectories_keep_their_arrays(log_path, open_log):
    log = open_log(log_path)
    original = make_traj("g", 0, versions=(3, 4, 5))
    log.append_trajectory(encode(original))
    log.file.close()
    restored = make_buffer(group_size=2)
    assert BufferLog.replay(log_path, restored).records == 1
    traj = restored.open["g"].trajectories[0]
    assert traj.policy_versions.tolist() == [3, 4, 5]
    assert traj.prompt_offsets.dtype == np.int64
    np.testing.assert_array_equal(traj.behaviour_logprobs, original.behaviour_logprobs)


def test_replay_of_a_missing_log_reads_nothing(tmp_path):
    buffer = make_buffer()
    assert BufferLog.replay(tmp_path / "absent.log", buffer).records == 0
    assert buffer.open == {} and buffer.ready == {}


def test_served_record_for_stale_groups_is_replayed(log_path, open_log):
    live = make_buffer(group_size=1, max_open_groups=3)
    log = open_log(log_path)
    a, _ = live.assign(0.0)
    traj = traj_for(a, versions=(0,))
    live.add(traj)
    log.append_trajectory(encode(traj))
    _, stale = take(live, 10, 1, 2)
    assert [g.group_id for g in stale] == [a.group_id]
    log.append_served(a.group_id)
    log.file.close()
    restored = make_buffer(group_size=1)
    BufferLog.replay(log_path, restored)
    assert restored.ready == {} and a.group_id in restored.served


@pytest.mark.parametrize("cut", [1, 40, "header"])
def test_replay_tolerates_a_torn_last_record(log_path, open_log, cut):
    log = open_log(log_path)
    first = make_traj("g", 0)
    log.append_trajectory(encode(first))
    size_after_first = log_path.stat().st_size
    log.append_trajectory(encode(make_traj("g", 1)))
    log.file.close()
    data = log_path.read_bytes()
    if cut == "header":  # only part of the last record's 9-byte header made it
        log_path.write_bytes(data[: size_after_first + 4])
    else:
        log_path.write_bytes(data[:-cut])

    restored = make_buffer(group_size=2)
    assert BufferLog.replay(log_path, restored).records == 1
    assert list(restored.open) == ["g"]
    assert sorted(restored.open["g"].trajectories) == [0]
    assert restored.ready == {}


def test_replay_tolerates_a_torn_served_record(log_path, open_log):
    log = open_log(log_path)
    for slot in range(2):
        log.append_trajectory(encode(make_traj("g", slot)))
    log.append_served("g")
    log.file.close()
    log_path.write_bytes(log_path.read_bytes()[:-1])
    restored = make_buffer(group_size=2)
    assert BufferLog.replay(log_path, restored).records == 2
    assert list(restored.ready) == ["g"]  # the served mark was lost, so it is served again


def test_records_appended_after_a_torn_tail_survive_the_next_restart(log_path, open_log):
    log = open_log(log_path)
    log.append_trajectory(encode(make_traj("g", 0)))
    log.append_trajectory(encode(make_traj("g", 1)))
    log.file.close()
    log_path.write_bytes(log_path.read_bytes()[:-10])  # crash mid-write

    # restart 1, in BufferProcess's order: replay, then open the log for appending
    first_restart = make_buffer(group_size=2)
    assert BufferLog.replay(log_path, first_restart).records == 1
    log = open_log(log_path)
    late = make_traj("g", 1, episode_id="resent")
    assert first_restart.add(late)
    log.append_trajectory(encode(late))
    log.file.close()

    # restart 2 must see both acknowledged trajectories
    second_restart = make_buffer(group_size=2)
    BufferLog.replay(log_path, second_restart)
    assert list(second_restart.ready) == ["g"]


def test_buffer_process_answers_its_message_types_and_refuses_others(tmp_path):
    """The process's handler table: a ping, an assignment and a trajectory are served (the
    trajectory persisted before its Ack); a type the buffer does not serve gets unexpected_kind."""
    from common.server import dispatch
    from pipeline.config import load_config, run_facts
    from protocol.messages import Ack, AssignmentRequest, AssignmentReturn, ErrorReply, MemoryQuery, Ping, Pong
    from replay_buffer.service import BufferProcess

    cfg = load_config([f"run_dir={tmp_path}", "replay_buffer.tasks=[boil]", "replay_buffer.group_size=2"])
    process = BufferProcess(cfg.replay_buffer, run_facts(cfg), {"boil": [4]})
    try:
        pong = dispatch(process.handlers, Ping(sender="t"), process.metrics)
        assert pong.uptime_s >= 0 and replace(pong, uptime_s=-1.0) == Pong(
            role="replay_buffer", policy_version=0, ready=True
        )
        assignment = dispatch(process.handlers, AssignmentRequest(actor_id="a"), process.metrics)
        assert isinstance(assignment, Assignment) and (assignment.task, assignment.variation) == ("boil", 4)
        traj = make_traj(
            assignment.group_id, assignment.slot, mode=assignment.mode, task="boil", variation=4, versions=(0, 1)
        )
        traj.score, traj.success = 90.0, True  # a solved episode: counted, and kept in the record
        assert dispatch(process.handlers, traj, process.metrics) == Ack(ref=traj.episode_id)
        returned = AssignmentReturn(group_id=assignment.group_id, slot=1, actor_id="a")
        assert dispatch(process.handlers, returned, process.metrics).detail == "no lease"  # slot 1 never handed out
        other = dispatch(process.handlers, AssignmentRequest(actor_id="b"), process.metrics)
        returned = AssignmentReturn(group_id=other.group_id, slot=other.slot, actor_id="b")
        assert dispatch(process.handlers, returned, process.metrics) == Ack(
            ref=f"{other.group_id}/1", detail="released"
        )
        query = MemoryQuery(task="boil", variation=4, state="s")
        reply = dispatch(process.handlers, query, process.metrics)
        assert isinstance(reply, ErrorReply) and reply.reason == "unexpected_kind"
        sample = process.metrics.registry.get_sample_value
        assert sample("empo2_replay_buffer_messages_rejected_total", {"reason": "unexpected_kind"}) == 1
        assert sample("empo2_replay_buffer_trajectories_accepted_total", {"mode": assignment.mode}) == 1
        assert sample("empo2_replay_buffer_trajectories_success_total", {"mode": assignment.mode}) == 1
        assert sample("empo2_replay_buffer_assignments_returned_total") == 1
    finally:
        process.log.file.close()
    replayed = ReplayBuffer(cfg.replay_buffer, {"boil": [4]}, cfg.seed)
    assert BufferLog.replay(tmp_path / cfg.replay_buffer.log_file, replayed).records == 1
    [record] = replayed.open[assignment.group_id].trajectories.values()
    assert record.success and record.generated_texts == traj.generated_texts
    np.testing.assert_array_equal(record.memory_retrieved, traj.memory_retrieved)


# ----------------------------------------------------------------------------- sync mode (pipeline.mode=sync)


def test_sync_mode_plays_one_batch_per_version_and_nothing_while_the_learner_steps():
    """A lockstep run of 3 learner steps: the buffer hands out exactly one batch of groups per
    version, none between serving a batch and the learner's request at the next version (its
    step and push), and every served turn was played by the version that learns from it."""
    groups_per_step = 2
    buffer = ReplayBuffer(make_cfg(max_open_groups=4, max_ready_groups=4), VARIATIONS, seed=0, sync_groups=2)
    server_version = 0  # what the policy servers serve: the learner's, after each push
    for version in range(3):
        buffer.start_round(version)  # the learner's BatchRequest at `version`
        played = []
        while (a := buffer.assign(0.0)[0]) is not None:  # the actors take everything handed out
            played.append(a)
        assert len({a.group_id for a in played}) == groups_per_step
        for a in played:
            assert buffer.add(traj_for(a, versions=(server_version, server_version)))
        batch, stale = buffer.take_batch(version, groups_per_step, 0, 1 << 26, 0.0)
        assert len(batch.groups) == groups_per_step and not stale
        staleness = {version - v for part in batch.parts for t in part for v in t.policy_versions.tolist()}
        assert staleness == {0}
        # the learner steps and pushes: the actors ask, and are told to wait
        assert buffer.assign(0.0) == (None, False)
        buffer.start_round(version)  # a repeated request at the same version opens nothing
        assert buffer.assign(0.0) == (None, False)
        server_version = version + 1  # the push is acknowledged before the next BatchRequest


def test_async_mode_keeps_handing_out_groups_while_the_learner_steps():
    buffer = make_buffer(max_open_groups=4, max_ready_groups=8)
    complete_group(buffer)
    complete_group(buffer)
    batch, _ = buffer.take_batch(5, 2, 4, 1 << 26, 0.0)
    assert len(batch.groups) == 2 and buffer.assign(0.0)[0] is not None  # no round: the actors play on


def test_sge_spreads_a_groups_strategy_temperatures_evenly_and_is_off_by_default():
    from common.config import SgeConfig

    sge = SgeConfig(enabled=True, strategy_temperature_min=0.6, strategy_temperature_max=1.4)
    buffer = ReplayBuffer(make_cfg(group_size=5), VARIATIONS, seed=0, sge=sge)
    group = [buffer.assign(now=0.0)[0] for _ in range(5)]
    assert len({a.group_id for a in group}) == 1
    assert [a.strategy_temperature for a in group] == pytest.approx([0.6, 0.8, 1.0, 1.2, 1.4])
    plain = ReplayBuffer(make_cfg(group_size=5), VARIATIONS, seed=0, sge=SgeConfig())  # enabled: false
    assert plain.assign(now=0.0)[0].strategy_temperature is None
    assert SgeConfig(enabled=True).strategy_temperature(0, 1) == 0.6  # a group of one: the lowest
