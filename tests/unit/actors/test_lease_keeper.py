"""actors/env_actor/lease.py: the keep-alive of an actor's slots (issue 38). The first round goes out at
once and names the process's incarnation; each env's slot is renewed while it plays; a renewal refused
lease_lost marks the slot lost, and the env drops the episode at its next turn. Against stub servers
(conftest.py) and a scripted stand-in for ScienceWorld."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from actors.env_actor.episode import EpisodeRunner
from actors.env_actor.lease import LeaseKeeper, LeaseLost
from actors.env_actor.process import EnvActor
from actors.env_actor.worker import EnvWorker
from protocol import Client, RemoteError
from protocol.messages import (
    ON_POLICY,
    Ack,
    Assignment,
    AssignmentRequest,
    ErrorReply,
    GenerateRequest,
    LeaseRenewal,
    Ping,
    Pong,
    Trajectory,
)
from tests.helpers import free_endpoint
from tests.unit.actors.test_env_worker import PlainPrompts, ScriptedEnv, _cfg, memory_answer, policy_answer


@pytest.fixture
def servers(stub_server):
    """(policy server, memory service, a replay buffer endpoint nothing listens on)"""
    return stub_server(policy_answer), stub_server(memory_answer), free_endpoint()


def _slot(group_id: str = "g1", slot: int = 1) -> Assignment:
    return Assignment(group_id=group_id, slot=slot, task="open-door", variation=1, mode=ON_POLICY, seed=2)


def _holder(actor_id: str, playing: Assignment | None = None):
    return SimpleNamespace(actor_id=actor_id, incarnation="inc-1", playing=playing, lease_lost=None)


def test_a_round_renews_each_envs_slot_and_announces_the_incarnation_of_an_idle_one(stub_server):
    buffer = stub_server(lambda msg: Ack(ref=f"{msg.group_id}/{msg.slot}"))
    idle, playing = _holder("actor0"), _holder("actor0.1", _slot())
    keeper = LeaseKeeper([idle, playing], buffer.endpoint, renew_s=60.0, timeout_s=5.0)
    client = Client(zmq.Context.instance(), buffer.endpoint, 5.0)
    try:
        keeper.renew_all(client)
    finally:
        client.close()
    assert buffer.received == [
        LeaseRenewal(actor_id="actor0", incarnation="inc-1"),
        LeaseRenewal(actor_id="actor0.1", incarnation="inc-1", group_id="g1", slot=1),
    ]
    assert idle.lease_lost is None and playing.lease_lost is None


def test_a_lost_lease_marks_the_slot_being_played_only(stub_server):
    errors = []
    buffer = stub_server(lambda msg: ErrorReply(reason="lease_lost", detail="handed out again"))
    done, playing = _holder("actor0"), _holder("actor1", _slot())
    keeper = LeaseKeeper([done, playing], buffer.endpoint, renew_s=60.0, timeout_s=5.0, on_error=errors.append)
    client = Client(zmq.Context.instance(), buffer.endpoint, 5.0)
    try:
        keeper.renew_all(client)
    finally:
        client.close()
    assert playing.lease_lost is playing.playing and done.lease_lost is None
    assert errors == []  # the env that drops the episode counts it


def test_the_thread_renews_every_period_until_stopped_and_counts_unanswered_renewals(stub_server):
    buffer = stub_server(lambda msg: Ack(ref="r"))
    holder = _holder("actor0", _slot())
    keeper = LeaseKeeper([holder], buffer.endpoint, renew_s=0.05, timeout_s=5.0).start()
    deadline = time.monotonic() + 10
    while len(buffer.received) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    keeper.stop(5.0)
    assert len(buffer.received) >= 3 and keeper.rounds >= 3
    seen = len(buffer.received)
    time.sleep(0.2)
    assert len(buffer.received) == seen  # stopped
    errors = []
    silent = LeaseKeeper([holder], "tcp://127.0.0.1:1", renew_s=60.0, timeout_s=0.2, on_error=errors.append)
    client = Client(zmq.Context.instance(), silent.endpoint, 0.2)
    try:
        silent.renew_all(client)  # no buffer: unanswered, counted, no exception
    finally:
        client.close()
    assert errors == ["lease_renewal"]


def test_a_worker_whose_slot_is_lost_drops_the_episode_at_its_next_turn(stub_server):
    """The training loop: the buffer hands out a slot, then refuses its renewal (lease_lost) while the
    first turn's generation is under way; the env stops at its next turn, uploads nothing, counts it,
    and asks for a new slot. Its assignment requests carry the process's incarnation."""
    given, lost = [], []

    def buffer_answer(msg):
        if isinstance(msg, Ping):
            return Pong(role="replay_buffer", policy_version=0, ready=True)
        if isinstance(msg, LeaseRenewal):
            if msg.group_id:
                lost.append(msg)
                return ErrorReply(reason="lease_lost", detail="handed out again")
            return Ack(ref="")
        if isinstance(msg, Trajectory):
            return Ack(ref=msg.episode_id)
        assert isinstance(msg, AssignmentRequest)
        if given:  # the second request ends the loop
            return ErrorReply(reason="stop", detail="end of the test")
        given.append(_slot("g-lost", 0))
        return given[-1]

    def slow_policy(msg):
        """policy_answer, a generation answered only once the keeper has been told the lease is lost."""
        if isinstance(msg, GenerateRequest):
            deadline = time.monotonic() + 5
            while not lost and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)
        return policy_answer(msg)

    buffer, policy, memory = stub_server(buffer_answer), stub_server(slow_policy), stub_server(memory_answer)
    worker = EnvWorker(
        **_cfg((policy, memory, buffer.endpoint), "env_actor.lease_renew_s=0.05", "replay_buffer.p_memory=0"),
        runner=EpisodeRunner(ScriptedEnv(3), PlainPrompts(), max_steps=5),
    )
    with pytest.raises(RemoteError):
        worker.run()
    assert not any(isinstance(m, Trajectory) for m in buffer.received)
    requests = [m for m in buffer.received if isinstance(m, AssignmentRequest)]
    assert len(requests) == 2 and {m.incarnation for m in requests} == {worker.incarnation}
    assert lost[0].incarnation == worker.incarnation
    sample = worker.metrics.registry.get_sample_value
    assert sample("empo2_env_actor_errors_total", {"where": "lease_lost"}) == 1
    assert worker.playing is None and worker.lease_lost is None


def test_generate_refuses_to_play_on_for_a_lost_slot(servers):
    worker = EnvWorker(**_cfg(servers), runner=EpisodeRunner(ScriptedEnv(1), PlainPrompts(), max_steps=5))
    try:
        worker.playing = worker.lease_lost = _slot()
        with pytest.raises(LeaseLost):
            worker.generate(np.arange(4, dtype=np.int32), seed=0)
        worker.lease_lost = _slot("another")  # a mark for another slot: this one plays on
        assert worker.generate(np.arange(4, dtype=np.int32), seed=0).text == "open door"
    finally:
        worker.close()


def test_an_actor_processs_envs_share_one_incarnation_and_a_new_process_draws_another(servers):
    first, second = EnvActor(**_cfg(servers, "env_actor.envs_per_actor=2")), EnvActor(**_cfg(servers))
    try:
        assert {w.incarnation for w in first.workers} == {first.incarnation}
        assert second.incarnation != first.incarnation
    finally:
        first.close()
        second.close()
