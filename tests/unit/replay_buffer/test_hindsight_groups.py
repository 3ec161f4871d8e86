"""HeRL's group rules by hand (replay_buffer/hindsight.py): the trigger, the candidates, the insertion."""

from __future__ import annotations

import random

import pytest

from replay_buffer.hindsight import Insertion, hindsight_candidates, insertion


def test_a_solved_group_triggers_nothing_and_an_unsolved_one_every_tied_best_member():
    assert hindsight_candidates([100.0, 40.0, 8.0, 40.0], max_candidates=16) == []
    assert hindsight_candidates([40.0, 8.0, 40.0, -100.0], max_candidates=16) == [0, 2]
    assert hindsight_candidates([17.0] * 20, max_candidates=16) == list(range(16))  # capped
    assert hindsight_candidates([8.0, 17.0, 8.0], max_candidates=1) == [1]


def test_a_strictly_better_revision_wins_else_an_equal_one_else_a_copy_not_marked():
    rng = random.Random(0)
    better = insertion([40.0, 8.0, 40.0, 0.0], [40.0, 65.0, 50.0], rng)
    assert better.revision == 1 and better.hindsight and 0 <= better.slot < 4  # the best of the better ones
    equal = insertion([40.0, 8.0, 40.0, 0.0], [8.0, 40.0], rng)
    assert equal.revision == 1 and equal.hindsight
    worse = insertion([40.0, 8.0, 40.0, 0.0], [8.0, -100.0], rng)
    assert worse.revision is None and not worse.hindsight
    slots = {insertion([1.0, 2.0, 3.0], [], random.Random(s)).slot for s in range(50)}
    assert slots == {0, 1, 2}  # one random slot of the group, any of them
    assert insertion([1.0], [], random.Random(1)) == Insertion(0, None, False)


def test_the_guidance_lists_exactly_the_false_lines_of_the_goal_progress_as_missed():
    from replay_buffer.hindsight import GUIDANCE_ACTIONS_SHOWN, guidance_text
    from testing.factories import plain_turns, trajectory
    from tests.unit.common.test_goal_progress import RECORDED

    attempt = trajectory(plain_turns(12), score=8.0)
    attempt.goal_progress = RECORDED
    attempt.actions = [f"look around {i}" for i in range(len(attempt.actions))]
    lines = guidance_text(attempt).splitlines()
    assert lines[0] == "An earlier attempt scored 8."
    assert lines[1] == "It achieved: Be in a room with an open door"
    assert lines[2] == (
        "It missed: focus on a living thing; move living thing to answer box; Pick up object; "
        "Move to a new location; Move to the location of the answer box"
    )
    assert lines[3].endswith(", ".join(attempt.actions[-GUIDANCE_ACTIONS_SHOWN:]))


def _buffer(**herl):
    from common.config import HerlConfig
    from replay_buffer.buffer import ReplayBuffer
    from replay_buffer.config import ReplayBufferConfig

    cfg = ReplayBufferConfig(tasks=["find-living-thing"], group_size=4, p_memory=0.0, max_open_groups=1)
    return ReplayBuffer(cfg, {"find-living-thing": [3]}, seed=0, herl=HerlConfig(enabled=True, **herl))


def _play(buffer, assignment, score: float, now: float = 0.0):
    from testing.factories import plain_turns, trajectory

    traj = trajectory(
        plain_turns(2), mode=assignment.mode, score=score, group_id=assignment.group_id, slot=assignment.slot,
        task=assignment.task,
    )  # fmt: skip
    traj.variation = assignment.variation
    buffer.check_lease(traj)
    assert buffer.add(traj)
    return traj


def test_an_unsolved_group_is_held_for_its_tied_best_members_revisions_then_the_best_takes_a_slot():
    from protocol.messages import GUIDED

    buffer = _buffer(max_candidates=16, alpha=0.05, temperature=0.3)
    members = [buffer.assign(0.0)[0] for _ in range(4)]
    played = [_play(buffer, a, s) for a, s in zip(members, (40.0, 8.0, 40.0, -100.0))]
    assert not buffer.ready  # held: none solved the task
    guided = [buffer.assign(0.0)[0] for _ in range(2)]
    assert [(a.mode, a.slot, a.temperature) for a in guided] == [(GUIDED, 4, 0.3), (GUIDED, 5, 0.3)]
    assert all(a.guidance.startswith("An earlier attempt scored 40.") for a in guided)
    assert buffer.assign(0.0)[0] is None  # max_open_groups: the held group is the one open
    _play(buffer, guided[0], 90.0)  # member 0's revision: 90
    assert not buffer.ready
    _play(buffer, guided[1], 20.0)  # member 2's: 20
    [group] = buffer.ready.values()
    final = [group.trajectories[s] for s in range(4)]
    assert len(final) == 4 and sum(t.hindsight for t in final) == 1  # the group size stays G
    [inserted] = [t for t in final if t.hindsight]
    assert inserted.score == 90.0 and inserted.mode == GUIDED  # strictly better than the best original
    bonus = {t.episode_id: t.score_bonus for t in final}
    replaced = inserted.slot
    if replaced != 0:
        assert bonus[played[0].episode_id] == pytest.approx(0.05 * (90 - 40))  # 42.5 - 40
    if replaced != 2:
        assert bonus[played[2].episode_id] == pytest.approx(0.05 * (20 - 40))  # 39 - 40
    counts = buffer.hindsight
    assert (counts.groups_guided, counts.guided_episodes, counts.revisions_beating_best) == (1, 2, 1)


def test_a_solved_group_is_ready_at_once_and_a_guided_group_goes_on_without_late_revisions():
    buffer = _buffer(guided_timeout_s=60.0)
    members = [buffer.assign(0.0)[0] for _ in range(4)]
    for a, s in zip(members, (100.0, 8.0, 40.0, 0.0)):
        _play(buffer, a, s)
    assert len(buffer.ready) == 1  # solved: no guidance
    buffer.ready.clear()
    members = [buffer.assign(0.0)[0] for _ in range(4)]
    for a in members:
        _play(buffer, a, 17.0)  # all tied: four candidates
    guided = buffer.assign(0.0)[0]
    import time

    later = time.time() + 61.0
    buffer.expire_guidance(later)
    [group] = buffer.ready.values()
    assert not any(t.hindsight for t in group.trajectories.values())  # no revision: a copy of the best
    assert sum(t.episode_id.endswith("-copy") for t in group.trajectories.values()) == 1
    assert buffer.hindsight.guided_timeouts == 4 and guided.slot == 4


def test_the_door_refuses_what_only_the_buffer_sets_and_a_guided_episode_in_a_members_slot():
    from protocol import ProtocolError
    from testing.factories import plain_turns, trajectory

    buffer = _buffer()
    a = buffer.assign(0.0)[0]
    traj = trajectory(plain_turns(1), group_id=a.group_id, slot=a.slot, task=a.task)
    traj.variation, traj.score_bonus = a.variation, 5.0
    with pytest.raises(ProtocolError, match="buffer's to set"):
        buffer.check_lease(traj)
    traj.score_bonus, traj.mode = 0.0, "guided"
    with pytest.raises(ProtocolError, match="mode differ"):
        buffer.check_lease(traj)


def test_a_restarted_buffer_replaying_its_log_closes_a_guided_group_the_same_way():
    first = _buffer(max_candidates=2)
    members = [first.assign(0.0)[0] for _ in range(4)]
    logged = [_play(first, a, s) for a, s in zip(members, (17.0, 17.0, 8.0, 17.0))]
    logged += [_play(first, first.assign(0.0)[0], s) for s in (25.0, 17.0)]  # the two revisions
    [closed] = first.ready.values()
    again = _buffer(max_candidates=2)
    for traj in logged:  # BufferLog.replay adds the log's trajectories in order, without leases
        assert again.add(traj)
    [replayed] = again.ready.values()
    view = [(t.episode_id, t.slot, t.hindsight, t.score_bonus) for _, t in sorted(closed.trajectories.items())]
    assert view == [
        (t.episode_id, t.slot, t.hindsight, t.score_bonus) for _, t in sorted(replayed.trajectories.items())
    ]
    assert sum(t.hindsight for t in closed.trajectories.values()) == 1
