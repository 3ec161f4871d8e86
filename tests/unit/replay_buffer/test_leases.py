"""replay_buffer.buffer: leases tied to liveness (issue 38). A slot is its actor's while the actor
renews it (LeaseRenewal); one not renewed for lease_ttl_s lapses and is handed out again (counted);
a restarted actor (a new incarnation) releases its predecessor's leases at once; a late episode for
a slot handed out again is refused or deduplicated, so every acknowledged episode is logged once.
And the process's side: LeaseRenewal answered Ack or ErrorReply(lease_lost), the lease metrics."""

from __future__ import annotations

import pytest

from protocol import ProtocolError
from replay_buffer.buffer import BufferLog, ReplayBuffer
from replay_buffer.config import Durability
from testing.factories import VARIATIONS, make_buffer, make_cfg, traj_for

TTL = 120.0


def lease_buffer(**overrides) -> ReplayBuffer:
    """max_open_groups 1 (the CPU profile's setting, where one stuck slot stalls the pipeline), groups
    of 2, leases of TTL seconds and the 30-minute cap."""
    values = dict(group_size=2, max_open_groups=1, lease_ttl_s=TTL, assignment_timeout_s=1800.0)
    values.update(overrides)
    return make_buffer(**values)


def accept(buffer: ReplayBuffer, traj) -> bool:
    """The service's path for an upload: the door (check_lease), then add."""
    if buffer.is_duplicate(traj):
        return False
    buffer.check_lease(traj)
    return buffer.add(traj)


def test_renewal_keeps_a_slot_past_the_ttl():
    buffer = lease_buffer()
    a, _ = buffer.assign(0.0, "actor0", "inc-a")
    b, _ = buffer.assign(0.0, "actor1", "inc-b")
    for t in range(30, 600, 30):  # renewed every 30 s for ten minutes, five TTLs
        assert buffer.renew(a.group_id, a.slot, "actor0", "inc-a", float(t))
        assert buffer.renew(b.group_id, b.slot, "actor1", "inc-b", float(t))
        assert buffer.assign(float(t), "actor2", "inc-c") == (None, False)  # nothing to hand out
    assert buffer.leases.renewed == 2 * 19 and buffer.leases.lapsed == 0


def test_a_lease_not_renewed_lapses_after_the_ttl_and_is_reissued_and_counted():
    buffer = lease_buffer()
    a, _ = buffer.assign(0.0, "actor0", "inc-a")  # actor0 is killed: it never renews
    b, _ = buffer.assign(0.0, "actor1", "inc-b")
    assert buffer.renew(b.group_id, b.slot, "actor1", "inc-b", 100.0)
    assert buffer.assign(TTL, "actor2", "inc-c") == (None, False)  # exactly the TTL: still live
    again, reissued = buffer.assign(TTL + 1, "actor2", "inc-c")
    assert reissued and (again.group_id, again.slot) == (a.group_id, a.slot)
    assert (again.task, again.variation, again.mode) == (a.task, a.variation, a.mode)
    assert buffer.leases.lapsed == 1
    assert buffer.assign(TTL + 1, "actor2", "inc-c") == (None, False)  # actor1's, renewed at 100: live
    # the new holder's renewals work, the old holder's no longer do
    assert buffer.renew(a.group_id, a.slot, "actor2", "inc-c", TTL + 2)
    assert not buffer.renew(a.group_id, a.slot, "actor0", "inc-a", TTL + 2)
    assert buffer.leases.lost == 1
    assert buffer.waiting_on() == {"actor1": 1, "actor2": 1}
    assert buffer.oldest_renewals() == {"actor1": 100.0, "actor2": TTL + 2}


def test_a_lapsed_lease_not_yet_reissued_is_still_its_holders():
    """Lapse is lazy: until another actor asks, a slow actor's renewal (or episode) keeps its slot."""
    buffer = lease_buffer()
    a, _ = buffer.assign(0.0, "actor0", "inc-a")
    assert buffer.renew(a.group_id, a.slot, "actor0", "inc-a", 10 * TTL)
    assert buffer.assign(10 * TTL + 1, "actor1", "inc-b")[0].slot == 1  # the other slot, not actor0's
    assert buffer.leases.lapsed == 0


def test_the_assignment_timeout_caps_a_lease_however_often_renewed():
    """A live process whose episode never ends (hang detection off) loses its slot at the cap."""
    buffer = lease_buffer(assignment_timeout_s=300.0)
    a, _ = buffer.assign(0.0, "actor0", "inc-a")
    buffer.assign(0.0, "actor1", "inc-b")
    for t in range(60, 301, 60):
        assert buffer.renew(a.group_id, a.slot, "actor0", "inc-a", float(t))
        buffer.renew(a.group_id, 1, "actor1", "inc-b", float(t))
    again, reissued = buffer.assign(301.0, "actor2", "inc-c")
    assert reissued and (again.group_id, again.slot) == (a.group_id, a.slot)


def test_a_new_incarnation_releases_its_predecessors_leases_at_once():
    buffer = lease_buffer(group_size=3, max_open_groups=2)
    a0, _ = buffer.assign(0.0, "actor0", "old")
    a1, _ = buffer.assign(0.0, "actor0", "old")  # two envs' worth: both its
    b, _ = buffer.assign(0.0, "actor1", "inc-b")
    c, _ = buffer.assign(0.0, "actor1", "inc-b")  # the second group
    assert buffer.assign(1.0, "actor2", "inc-c")[0].group_id == c.group_id  # actor2 takes a slot of it
    buffer.assign(1.0, "actor2", "inc-c")
    assert buffer.assign(1.0, "actor2", "inc-c") == (None, False)  # every slot handed out
    # actor0 restarts: its first message (a renewal of no slot) names its new incarnation
    assert buffer.renew("", 0, "actor0", "new", 2.0)
    assert buffer.leases.released_restart == 2
    assert buffer.waiting_on() == {"": 2, "actor1": 2, "actor2": 2}
    # its old slots go out again at once, long before the TTL, and not as lapsed leases
    got = [buffer.assign(3.0, "actor0", "new") for _ in range(2)]
    assert [(g.group_id, g.slot, reissued) for g, reissued in got] == [
        (a0.group_id, a0.slot, False),
        (a1.group_id, a1.slot, False),
    ]
    assert buffer.leases.lapsed == 0
    assert buffer.renew(b.group_id, b.slot, "actor1", "inc-b", 4.0)  # other actors keep theirs
    # the dead incarnation can take nothing back: its late renewal is refused, and it retires
    assert not buffer.renew(a0.group_id, a0.slot, "actor0", "old", 5.0)
    assert buffer.incarnations["actor0"] == "new"
    assert buffer.see_incarnation("actor0", "old") == 0 and buffer.incarnations["actor0"] == "new"


def test_an_assignment_request_of_a_new_incarnation_releases_too():
    buffer = lease_buffer()
    a, _ = buffer.assign(0.0, "actor0", "old")
    buffer.assign(0.0, "actor1", "inc-b")
    again, reissued = buffer.assign(1.0, "actor0", "new")  # the restarted actor asks: gets its old slot
    assert (again.group_id, again.slot, reissued) == (a.group_id, a.slot, False)
    assert buffer.leases.released_restart == 1


def test_an_actor_without_an_incarnation_keeps_the_plain_ttl():
    """Clients that say no incarnation (older actors, benchmarks) are never taken for restarted."""
    buffer = lease_buffer()
    a, _ = buffer.assign(0.0, "actor0")
    buffer.assign(0.0, "actor0")
    assert buffer.see_incarnation("actor0", "") == 0
    assert buffer.assign(TTL, "actor0") == (None, False)
    assert buffer.assign(TTL + 1, "actor0")[1]  # lapsed: reissued


def test_a_return_releases_only_the_returning_actors_lease():
    buffer = lease_buffer()
    a, _ = buffer.assign(0.0, "actor0", "inc-a")
    buffer.assign(0.0, "actor1", "inc-b")
    again, reissued = buffer.assign(TTL + 1, "actor2", "inc-c")  # actor0's lapsed: now actor2's
    assert reissued and again.slot == a.slot
    assert not buffer.release(a.group_id, a.slot, "actor0", "inc-a")  # actor0 stopping late: not its any more
    assert buffer.release(a.group_id, a.slot, "actor2", "inc-c")
    assert buffer.leases.released_return == 1


@pytest.mark.parametrize("first", ["late", "reissued"])
def test_a_late_episode_for_a_reissued_slot_leaves_exactly_one_episode_in_the_log(tmp_path, first):
    """actor0's lease lapses (it was stopped, not dead) and the slot goes to actor1; both finish. The
    first episode to arrive fills the slot, the other is refused slot_filled, a re-send of the first
    is a duplicate; the loser, if still playing, learns it at its next renewal. The log holds one
    episode per slot, and a restarted buffer replays exactly the acknowledged ones."""
    path = tmp_path / "buffer.log"
    log = BufferLog(path, Durability.flush)
    buffer = lease_buffer()
    a, _ = buffer.assign(0.0, "actor0", "inc-a")
    other, _ = buffer.assign(0.0, "actor9", "inc-9")
    again, reissued = buffer.assign(TTL + 1, "actor1", "inc-b")
    assert reissued and again.slot == a.slot
    late, fresh = traj_for(a, episode_id="late"), traj_for(again, episode_id="fresh")
    winner, loser = (late, fresh) if first == "late" else (fresh, late)
    acknowledged = []
    assert accept(buffer, winner)
    log.append_trajectory(_frames(winner))
    acknowledged.append(winner.episode_id)
    with pytest.raises(ProtocolError) as refused:
        accept(buffer, loser)
    assert refused.value.reason == "slot_filled"
    assert buffer.is_duplicate(winner)  # a re-send of the winner: Ack(duplicate=True), nothing stored
    # the loser's holder learns it at its next renewal
    loser_actor, loser_inc = ("actor1", "inc-b") if first == "late" else ("actor0", "inc-a")
    assert not buffer.renew(a.group_id, a.slot, loser_actor, loser_inc, TTL + 5)
    done = traj_for(other, episode_id="other")
    assert accept(buffer, done)
    log.append_trajectory(_frames(done))
    acknowledged.append(done.episode_id)
    log.close()
    assert list(buffer.ready) == [a.group_id]
    [group] = buffer.ready.values()
    assert group.trajectories[a.slot].episode_id == winner.episode_id
    trajectories, _, _ = BufferLog.read(path)
    assert sorted(t.episode_id for t in trajectories) == sorted(acknowledged)  # each exactly once
    replayed = ReplayBuffer(make_cfg(group_size=2, max_open_groups=1), VARIATIONS, seed=0)
    assert BufferLog.replay(path, replayed).records == 2
    assert {t.episode_id for t in replayed.ready[a.group_id].trajectories.values()} == {winner.episode_id, "other"}


def _frames(traj):
    from protocol import encode

    return encode(traj)


def test_a_renewal_for_a_group_the_restarted_buffer_lost_is_refused_and_one_it_rebuilt_is_retaken(tmp_path):
    """After a buffer restart its leases are gone: a renewal of a free slot of a group rebuilt from
    the log takes the lease back (no one else holds it); one of a group it never logged is lost."""
    buffer = lease_buffer(group_size=3)
    a, _ = buffer.assign(0.0, "actor0", "inc-a")
    b, _ = buffer.assign(0.0, "actor1", "inc-b")
    path = tmp_path / "buffer.log"
    log = BufferLog(path, Durability.flush)
    first = traj_for(a)
    assert accept(buffer, first)
    log.append_trajectory(_frames(first))
    log.close()
    restarted = lease_buffer(group_size=3)
    BufferLog.replay(path, restarted)
    assert restarted.renew(b.group_id, b.slot, "actor1", "inc-b", 1.0)  # retaken
    assert not restarted.renew(b.group_id, b.slot, "actor2", "inc-c", 1.0)  # actor1's now
    assert not restarted.renew("never-logged", 0, "actor3", "inc-d", 1.0)


def test_the_process_answers_renewals_and_exports_the_lease_metrics(tmp_path):
    from common.server import dispatch
    from pipeline.config import load_config, run_facts
    from protocol.messages import Ack, Assignment, AssignmentRequest, ErrorReply, LeaseRenewal
    from replay_buffer.service import BufferProcess

    cfg = load_config(
        [
            f"run_dir={tmp_path}",
            "replay_buffer.tasks=[boil]",
            "replay_buffer.group_size=2",
            "replay_buffer.max_open_groups=1",
        ]
    )
    process = BufferProcess(cfg.replay_buffer, run_facts(cfg), {"boil": [4]})
    try:
        handlers, metrics = process.handlers, process.metrics
        sample = metrics.registry.get_sample_value
        a = dispatch(handlers, AssignmentRequest(actor_id="actor0", incarnation="old"), metrics)
        b = dispatch(handlers, AssignmentRequest(actor_id="actor1", incarnation="inc-b"), metrics)
        assert isinstance(a, Assignment) and isinstance(b, Assignment)
        renewal = LeaseRenewal(actor_id="actor0", incarnation="old", group_id=a.group_id, slot=a.slot)
        assert dispatch(handlers, renewal, metrics) == Ack(ref=f"{a.group_id}/{a.slot}", detail="renewed")
        assert sample("empo2_replay_buffer_leases", {"event": "renewed"}) == 1
        assert sample("empo2_replay_buffer_open_slots", {"holder": "actor0"}) == 1
        assert sample("empo2_replay_buffer_groups_open") == 1
        assert sample("empo2_replay_buffer_lease_renewed_at_seconds", {"holder": "actor0"}) > 0
        # actor0 restarts: the announcement of its new incarnation frees its slot at once
        hello = LeaseRenewal(actor_id="actor0", incarnation="new")
        assert dispatch(handlers, hello, metrics).detail == "no slot"
        assert sample("empo2_replay_buffer_leases", {"event": "released_restart"}) == 1
        assert sample("empo2_replay_buffer_open_slots", {"holder": "none"}) == 1
        assert sample("empo2_replay_buffer_open_slots", {"holder": "actor0"}) is None
        # the old incarnation's late renewal: refused lease_lost, counted
        reply = dispatch(handlers, renewal, metrics)
        assert isinstance(reply, ErrorReply) and reply.reason == "lease_lost"
        assert sample("empo2_replay_buffer_messages_rejected_total", {"reason": "lease_lost"}) == 1
        assert sample("empo2_replay_buffer_leases", {"event": "lost"}) == 1
        again = dispatch(handlers, AssignmentRequest(actor_id="actor0", incarnation="new"), metrics)
        assert (again.group_id, again.slot) == (a.group_id, a.slot)
        assert sample("empo2_replay_buffer_assignments_reissued_total") == 0  # released, not lapsed
    finally:
        process.log.file.close()
