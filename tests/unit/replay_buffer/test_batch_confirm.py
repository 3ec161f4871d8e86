"""A batch too large for the learner is not lost (issue 14): a batch is served in parts that each fit
the learner's message limit, its groups stay the buffer's until the learner confirms it
(BatchConfirm) and are re-served when it does not (timeout, or the learner asks anew after a
restart), and a trajectory too large for any batch is refused at the door. The learner's side
(next_batch over the parts, confirm) runs against the buffer process's handlers over a real socket."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import zmq

from common.server import AfterCommit, dispatch, serve_requests
from learner.config import LearnerConfig
from learner.train import Learner
from pipeline.config import load_config, run_facts
from protocol import Client, encode
from protocol.codec import DEFAULT_MAX_MESSAGE_BYTES
from protocol.messages import (
    BATCH_ENVELOPE_BYTES,
    Ack,
    Assignment,
    AssignmentRequest,
    Batch,
    BatchConfirm,
    BatchRequest,
    ErrorReply,
    Wait,
)
from replay_buffer.buffer import BufferLog, ReplayBuffer
from replay_buffer.service import BufferProcess
from testing.factories import make_buffer, make_traj, open_group, traj_for
from tests.helpers import free_endpoint

# groups open and ready at once (the CPU profile's 1 would hand out one group at a time)
ROOM = ["replay_buffer.max_open_groups=4", "replay_buffer.max_ready_groups=4"]
# a buffer on its own takes BatchRequests from these tests, which hold no learner token (issue 26)
ANY_CLIENT = "security.insecure=true"
BIG = 20_000  # prompt tokens per turn: ~160 kB per two-turn trajectory


def encoded_size(msg) -> int:
    return sum(len(memoryview(f)) for f in encode(msg))


def fill(buffer: ReplayBuffer, groups: int, prompt_len: int = 3) -> list[str]:
    ids = []
    for _ in range(groups):
        assignments = open_group(buffer)
        for a in assignments:
            traj = traj_for(a, prompt_len=prompt_len)
            assert buffer.add(traj, encoded_size(traj))
        ids.append(assignments[0].group_id)
    return ids


# ---------------------------------------------------------------------------------- buffer logic


def test_a_batch_over_the_learners_limit_is_split_into_parts_that_each_fit():
    buffer = make_buffer(group_size=3, max_open_groups=4)
    ids = fill(buffer, 2, prompt_len=BIG)
    one = encoded_size(next(iter(buffer.ready[ids[0]].trajectories.values())))
    max_bytes = BATCH_ENVELOPE_BYTES + 2 * one + 100  # two trajectories per part
    batch, stale = buffer.take_batch(5, 2, 4, max_bytes, now=0.0)
    assert stale == [] and batch.group_ids == ids
    assert [len(p) for p in batch.parts] == [2, 2, 2]
    for i, part in enumerate(batch.parts):
        message = Batch(trajectories=part, dropped_stale=0, batch_id=batch.batch_id, part=i, num_parts=3)
        assert encoded_size(message) <= max_bytes
    in_order = [t.episode_id for p in batch.parts for t in p]
    assert in_order == [f"{g}-{s}" for g in ids for s in range(3)]


def test_a_trajectory_alone_over_the_learners_limit_is_a_value_error_and_nothing_is_taken():
    buffer = make_buffer(group_size=2)
    [gid] = fill(buffer, 1, prompt_len=BIG)
    with pytest.raises(ValueError, match="over the learner's"):
        buffer.take_batch(5, 1, 4, BATCH_ENVELOPE_BYTES + 1000, now=0.0)
    assert list(buffer.ready) == [gid] and buffer.in_flight == {}


def test_groups_are_used_only_when_confirmed():
    buffer = make_buffer(group_size=2, max_open_groups=4)
    ids = fill(buffer, 2)
    batch, _ = buffer.take_batch(5, 1, 4, DEFAULT_MAX_MESSAGE_BYTES, now=0.0)
    assert batch.group_ids == ids[:1] and ids[0] not in buffer.served
    assert not buffer.add(make_traj(ids[0], 0, episode_id="late"))  # a group in flight takes nothing new
    assert buffer.confirm(batch.batch_id) == ids[:1]
    assert ids[0] in buffer.served and buffer.in_flight == {}
    assert buffer.confirm(batch.batch_id) is None  # a second confirm is a no-op


def test_an_unconfirmed_batch_is_re_served_after_the_timeout_first_in_line():
    buffer = make_buffer(group_size=2, max_open_groups=4, batch_confirm_timeout_s=60.0)
    ids = fill(buffer, 3)
    batch, _ = buffer.take_batch(5, 2, 4, DEFAULT_MAX_MESSAGE_BYTES, now=0.0)
    assert buffer.requeue_unconfirmed(now=59.0) == 0
    assert buffer.requeue_unconfirmed(now=61.0) == 2
    assert list(buffer.ready) == ids  # the requeued groups ahead of the one that waited
    assert buffer.confirm(batch.batch_id) is None  # too late: they will be served again
    again, _ = buffer.take_batch(5, 2, 4, DEFAULT_MAX_MESSAGE_BYTES, now=62.0)
    assert again.group_ids == ids[:2] and again.batch_id != batch.batch_id


def test_a_restarted_buffer_re_serves_an_unconfirmed_batch_and_never_a_confirmed_one(tmp_path):
    cfg = load_config(
        [f"run_dir={tmp_path}", "replay_buffer.tasks=[boil]", "replay_buffer.group_size=2", *ROOM, ANY_CLIENT]
    )
    process = BufferProcess(cfg.replay_buffer, run_facts(cfg), {"boil": [4]})
    for _ in range(4):  # two complete groups
        a = dispatch(process.handlers, AssignmentRequest(actor_id="a"), process.metrics)
        assert isinstance(dispatch(process.handlers, traj_for(a, versions=(0, 0)), process.metrics), Ack)
    request = BatchRequest(learner_version=0, num_groups=1, max_staleness=4)
    first = dispatch(process.handlers, request, process.metrics)
    dispatch(process.handlers, BatchConfirm(batch_id=first.batch_id), process.metrics)
    second = dispatch(process.handlers, request, process.metrics)  # served, never confirmed
    process.log.close()
    restored = ReplayBuffer(cfg.replay_buffer, {"boil": [4]}, cfg.seed)
    BufferLog.replay(tmp_path / cfg.replay_buffer.log_file, restored)
    assert list(restored.ready) == [second.trajectories[0].group_id]
    assert first.trajectories[0].group_id in restored.served


# ------------------------------------------------------------------------------ buffer process


@pytest.fixture
def process(tmp_path):
    cfg = load_config(
        [
            f"run_dir={tmp_path}",
            "replay_buffer.tasks=[boil]",
            "replay_buffer.group_size=2",
            "learner.groups_per_step=2",
            *ROOM,
            ANY_CLIENT,
        ]
    )
    process = BufferProcess(cfg.replay_buffer, run_facts(cfg), {"boil": [4]})
    yield process
    process.log.close()


def play(process: BufferProcess, groups: int, prompt_len: int = 3) -> None:
    for _ in range(2 * groups):
        a = dispatch(process.handlers, AssignmentRequest(actor_id="a"), process.metrics)
        assert isinstance(a, Assignment)
        reply = dispatch(process.handlers, traj_for(a, versions=(0, 0), prompt_len=prompt_len), process.metrics)
        assert isinstance(reply, Ack), reply


def test_a_trajectory_too_large_for_any_batch_is_refused_at_the_door(tmp_path):
    cfg = load_config([f"run_dir={tmp_path}", "replay_buffer.tasks=[boil]", "replay_buffer.max_trajectory_bytes=50000"])
    process = BufferProcess(cfg.replay_buffer, run_facts(cfg), {"boil": [4]})
    try:
        a = dispatch(process.handlers, AssignmentRequest(actor_id="a"), process.metrics)
        reply = dispatch(process.handlers, traj_for(a, prompt_len=BIG), process.metrics)
        assert isinstance(reply, ErrorReply) and reply.reason == "too_large"
        assert process.buffer.episode_ids == set()
        sample = process.metrics.registry.get_sample_value
        assert sample("empo2_replay_buffer_messages_rejected_total", {"reason": "too_large"}) == 1
    finally:
        process.log.close()
    assert (
        BufferLog.replay(
            tmp_path / cfg.replay_buffer.log_file, ReplayBuffer(cfg.replay_buffer, {"boil": [4]}, 0)
        ).records
        == 0
    )


def test_a_learner_that_asks_anew_without_confirming_gets_the_same_groups(process):
    play(process, 2)
    request = BatchRequest(learner_version=0, num_groups=2, max_staleness=4)
    first = dispatch(process.handlers, request, process.metrics)
    again = dispatch(process.handlers, request, process.metrics)  # the learner restarted
    assert [t.episode_id for t in again.trajectories] == [t.episode_id for t in first.trajectories]
    assert again.batch_id != first.batch_id
    unknown = dispatch(process.handlers, BatchConfirm(batch_id=first.batch_id), process.metrics)
    assert isinstance(unknown, Ack) and "not in flight" in unknown.detail
    assert isinstance(dispatch(process.handlers, BatchConfirm(batch_id=again.batch_id), process.metrics), Ack)
    assert isinstance(dispatch(process.handlers, request, process.metrics), Wait)  # used: nothing left
    sample = process.metrics.registry.get_sample_value
    assert sample("empo2_replay_buffer_groups_requeued_total") == 2
    assert sample("empo2_replay_buffer_groups_confirmed_total") == 2


def test_a_part_of_a_batch_not_in_flight_is_an_unknown_batch_error(process):
    reply = dispatch(process.handlers, BatchRequest(0, 2, 4, batch_id="nope", part=1), process.metrics)
    assert isinstance(reply, ErrorReply) and reply.reason == "unknown_batch"


def test_group_durability_holds_acks_until_the_commit(tmp_path):
    cfg = load_config([f"run_dir={tmp_path}", "replay_buffer.tasks=[boil]", "replay_buffer.durability=group"])
    process = BufferProcess(cfg.replay_buffer, run_facts(cfg), {"boil": [4]})
    try:
        a = dispatch(process.handlers, AssignmentRequest(actor_id="a"), process.metrics)
        assert isinstance(a, Assignment)  # nothing written: answered at once
        held = dispatch(process.handlers, traj_for(a, versions=(0, 0)), process.metrics)
        assert isinstance(held, AfterCommit) and isinstance(held.reply, Ack)
        assert process.log.unsynced == 1
        process.commit()
        assert process.log.unsynced == 0 and process.log.fsyncs == 1
    finally:
        process.log.close()


def test_held_replies_go_out_after_one_commit_while_requests_keep_being_served():
    """serve_requests' group commit over a real ROUTER: replies wrapped in AfterCommit wait for the
    next commit (one for all of them); the others go out at once."""
    endpoint, commits = free_endpoint(), []
    handlers = {
        BatchConfirm: lambda msg: AfterCommit(Ack(ref=msg.batch_id)),
        AssignmentRequest: lambda msg: Wait(retry_after_s=1.0),
    }
    threading.Thread(
        target=serve_requests,
        args=(endpoint, handlers, SimpleNamespace(**_null_metrics())),
        kwargs=dict(commit=lambda: commits.append(1), commit_interval_s=0.3),
        daemon=True,
    ).start()
    ctx = zmq.Context.instance()
    clients = [Client(ctx, endpoint, timeout_s=5) for _ in range(3)]
    for i, c in enumerate(clients[:2]):
        c.send(BatchConfirm(batch_id=f"b{i}"))
    assert isinstance(clients[2].call(AssignmentRequest(actor_id="x")), Wait)  # not held back
    assert commits == []
    assert [c.recv().ref for c in clients[:2]] == ["b0", "b1"]
    assert commits == [1]
    for c in clients:
        c.close()


def _null_metrics() -> dict:
    class Null:
        def labels(self, *_):
            return self

        def inc(self, *_):
            pass

    return dict(rejected=Null(), messages_in=Null(), messages_out=Null(), handshake_failures=Null())


# ------------------------------------------------------------------------------ learner's side


def test_the_learner_assembles_every_part_and_confirms_the_batch(process):
    """84 MB of one group made a Batch the learner's 64 MiB limit refused while the buffer had
    marked the group served. Scaled down: a learner limit of 400 kB, groups of ~160 kB trajectories."""
    play(process, 2, prompt_len=BIG)
    endpoint = free_endpoint()
    threading.Thread(target=serve_requests, args=(endpoint, process.handlers, process.metrics), daemon=True).start()
    client = Client(zmq.Context.instance(), endpoint, timeout_s=10, max_bytes=400_000)
    learner = SimpleNamespace(
        buffer=client, run_facts=process.run_facts, lcfg=LearnerConfig(groups_per_step=2), version=0
    )
    learner._call_buffer = lambda msg: Learner._call_buffer(learner, msg)
    try:
        batch = Learner.next_batch(learner)
        assert len(batch.trajectories) == 4 and len({t.episode_id for t in batch.trajectories}) == 4
        sample = process.metrics.registry.get_sample_value
        assert sample("empo2_replay_buffer_batch_parts_total") >= 2  # it did not fit one message
        assert process.buffer.served == set()  # not used yet
        Learner.confirm(learner, batch.batch_id)
        assert len(process.buffer.served) == 2 and process.buffer.in_flight == {}
    finally:
        client.close()
