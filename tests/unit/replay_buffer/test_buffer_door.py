"""The replay buffer's door (issue 14): a trajectory is stored only when it answers a lease the
buffer handed out, in its group's task, variation and mode, with versions it can have; a re-send
gets Ack(duplicate=True); a refusal is an ErrorReply with its reason, counted, and nothing is stored.
Only the learner (its token) takes batches, at a version it can have."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from common.server import dispatch
from pipeline.config import load_config, run_facts
from protocol.messages import (
    OFF_POLICY,
    ON_POLICY,
    Ack,
    Assignment,
    AssignmentRequest,
    Batch,
    BatchRequest,
    ErrorReply,
    Wait,
)
from replay_buffer.buffer import trajectory_bytes
from replay_buffer.service import NO_LEARNER_CHECK, BufferProcess
from testing.factories import make_traj


def buffer_process(run_dir, *security: str) -> BufferProcess:
    cfg = load_config(
        [
            f"run_dir={run_dir}",
            "replay_buffer.tasks=[boil]",
            "replay_buffer.group_size=2",
            "learner.groups_per_step=1",
            "learner.total_steps=10",
            *security,
        ]
    )
    return BufferProcess(cfg.replay_buffer, run_facts(cfg), {"boil": [4]}, vocab_size=1000)


@pytest.fixture
def process(tmp_path):
    process = buffer_process(tmp_path, "security.learner_token=s3cret")
    yield process
    process.log.file.close()


def call(process, msg):
    return dispatch(process.handlers, msg, process.metrics, limits=process.limits)


def rejected(process, reason):
    return process.metrics.registry.get_sample_value("empo2_replay_buffer_messages_rejected_total", {"reason": reason})


def leased(process, slot_of: Assignment | None = None, **changes):
    a = slot_of or call(process, AssignmentRequest(actor_id="a"))
    traj = make_traj(a.group_id, a.slot, mode=a.mode, task=a.task, variation=a.variation, versions=(0, 0))
    return a, dataclasses.replace(traj, **changes) if changes else traj


def test_a_leased_slot_is_stored_and_a_resend_is_a_duplicate(process):
    _, traj = leased(process)
    assert call(process, traj) == Ack(ref=traj.episode_id)
    assert call(process, traj) == Ack(ref=traj.episode_id, detail="already stored", duplicate=True)
    assert process.metrics.registry.get_sample_value("empo2_replay_buffer_trajectories_duplicate_total") == 1


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"group_id": "made-up-group"}, "no_lease"),
        ({"slot": 7}, "no_lease"),
        ({"slot": 1}, "no_lease"),  # in the group, but not handed out
        ({"task": "melt"}, "task"),  # not one of the run's tasks: refused before any metric label
        ({"variation": 5}, "wrong_group"),
        ({"policy_versions": np.array([0, 9], np.int32)}, "version_ahead"),
        ({"response_token_ids": np.array([1, 2, 3, 1000], np.int32)}, "vocab"),
        ({"observations": ["x" * 20_000, "o"]}, "too_long"),
    ],
)
def test_a_wrong_trajectory_is_refused_with_its_reason_and_not_stored(process, change, reason):
    _, traj = leased(process, **change)
    reply = call(process, traj)
    assert isinstance(reply, ErrorReply) and reply.reason == reason
    assert rejected(process, reason) == 1
    assert traj.episode_id not in process.buffer.episode_ids
    assert process.log.file.tell() == 0  # nothing logged


def test_a_mode_that_contradicts_the_group_is_refused(process):
    a, traj = leased(process)
    other = OFF_POLICY if a.mode == ON_POLICY else ON_POLICY
    traj = dataclasses.replace(traj, mode=other)
    traj.memory_retrieved = np.zeros(traj.num_turns, np.uint8)
    assert call(process, traj).reason == "wrong_group"


def test_a_filled_slot_refuses_another_episode(process):
    a, traj = leased(process)
    call(process, traj)
    assert call(process, dataclasses.replace(traj, episode_id="another")).reason == "slot_filled"


def test_batches_only_for_the_learner_at_a_version_it_can_have(process):
    request = BatchRequest(learner_version=0, num_groups=1, max_staleness=4)
    assert call(process, request).reason == "not_learner"
    assert call(process, dataclasses.replace(request, token="guess")).reason == "not_learner"
    ok = dataclasses.replace(request, token="s3cret")
    assert call(process, dataclasses.replace(ok, learner_version=2**63 - 1)).reason == "version_ahead"
    assert isinstance(call(process, ok), Wait)  # the learner, at its version: nothing ready yet
    assert call(process, dataclasses.replace(ok, learner_version=2)).reason == "version_ahead"  # a jump
    assert process.learner_version == 0  # the refused requests changed nothing
    a, t0 = leased(process)
    a1 = call(process, AssignmentRequest(actor_id="b"))
    _, t1 = leased(process, a1)
    assert call(process, t0) == Ack(ref=t0.episode_id) and call(process, t1) == Ack(ref=t1.episode_id)
    batch = call(process, dataclasses.replace(ok, learner_version=1))
    assert isinstance(batch, Batch) and len(batch.trajectories) == 2


def test_a_buffer_without_curve_or_a_token_serves_no_batch_unless_told_insecure(tmp_path, caplog):
    """Secure by default (issue 26): with neither security.curve nor security.learner_token every
    BatchRequest is refused (no_learner_auth, counted) whatever token it carries, and the start-up
    log says once how to configure one; security.insecure=true serves any client instead, and a
    configured token (or CURVE) is checked as before."""
    request = BatchRequest(learner_version=0, num_groups=1, max_staleness=4)
    with caplog.at_level(logging.WARNING, logger="replay_buffer"):
        closed = buffer_process(tmp_path / "closed")
    try:
        for token in ("", "s3cret", "guess"):
            reply = call(closed, dataclasses.replace(request, token=token))
            assert isinstance(reply, ErrorReply) and reply.reason == "no_learner_auth"
            assert "security.learner_token" in reply.detail
        assert rejected(closed, "no_learner_auth") == 3
        assert closed.learner_version == 0 and not closed.learner_seen  # the refused requests changed nothing
        assert [r.getMessage() for r in caplog.records if r.name == "replay_buffer"] == [NO_LEARNER_CHECK]
        assert "security.insecure=true" in NO_LEARNER_CHECK and "security.curve=true" in NO_LEARNER_CHECK
    finally:
        closed.log.file.close()

    served = {
        "insecure": buffer_process(tmp_path / "insecure", "security.insecure=true"),
        "curve": buffer_process(tmp_path / "curve", "security.curve=true"),  # the key is checked by ZAP
        "token": buffer_process(tmp_path / "token", "security.learner_token=s3cret", "security.insecure=true"),
    }
    try:
        for token in ("", "guess"):
            assert isinstance(call(served["insecure"], dataclasses.replace(request, token=token)), Wait)
        assert isinstance(call(served["curve"], request), Wait)
        assert call(served["token"], dataclasses.replace(request, token="guess")).reason == "not_learner"
        assert isinstance(call(served["token"], dataclasses.replace(request, token="s3cret")), Wait)
    finally:
        for p in served.values():
            p.log.file.close()


def test_no_new_group_once_the_held_bytes_reach_the_limit(process):
    a, traj = leased(process)
    call(process, traj)
    process.run_facts.security.max_held_trajectory_bytes = trajectory_bytes(traj)
    assert process.buffer.held_bytes() == trajectory_bytes(traj)
    assert isinstance(call(process, AssignmentRequest(actor_id="b")), Wait)
