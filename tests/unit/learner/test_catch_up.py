"""The learner's catch-up (learner/train.py): while it waits for a batch it asks each policy server's
version and pushes the current weights to those behind (restarted: waiting for the run's newest
version, or simply older), only to them, at most every CATCH_UP_EVERY_S. Against stub servers on real
ZeroMQ sockets; the learner's model and push are left out (the push is recorded)."""

from __future__ import annotations

import types

import pytest
import zmq

import learner.train as train
from common.config import WeightSyncConfig
from common.metrics import LearnerMetrics
from protocol import Client
from protocol.messages import ErrorReply, Ping, Pong


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    """One learner process (the learner's own gloo group of one is not set up here)."""
    monkeypatch.setattr(train.distributed, "world_size", lambda: 1)


def _learner(version: int, endpoints: list[str], method: str = "zmq") -> train.Learner:
    learner = train.Learner.__new__(train.Learner)  # no model: catch_up needs only these
    learner.trainer = types.SimpleNamespace(version=version)
    learner.weight_sync = WeightSyncConfig(method=method)
    learner.metrics = LearnerMetrics()
    learner.policies = [Client(zmq.Context.instance(), ep, timeout_s=1.0) for ep in endpoints]
    learner._next_catch_up = 0.0
    learner.pushed = []
    learner.push = lambda clients=None: learner.pushed.append([c.endpoint for c in clients])
    return learner


def _server(stub_server, version: int, awaiting: int = 0, ready: bool = True):
    def answer(msg):
        assert isinstance(msg, Ping)
        return Pong(role="policy_server", policy_version=version, ready=ready, awaiting_version=awaiting)

    return stub_server(answer)


def test_only_the_servers_behind_get_the_weights(stub_server, monkeypatch):
    current = _server(stub_server, version=5)
    restarted = _server(stub_server, version=0, awaiting=5)  # loaded the base model, waits for v5
    older = _server(stub_server, version=4)
    starting = _server(stub_server, version=-1, ready=False)  # its engine loads: the push would wait
    refusing = stub_server(lambda msg: ErrorReply(reason="overloaded", detail="x"))
    servers = [current, restarted, older, starting, refusing]
    learner = _learner(5, [s.endpoint for s in servers])
    try:
        learner.catch_up()
        assert learner.pushed == [[restarted.endpoint, older.endpoint]]
        assert learner.metrics.registry.get_sample_value("empo2_learner_catch_up_pushes_total") == 2
        learner.catch_up()  # within CATCH_UP_EVERY_S: nothing asked
        assert len(learner.pushed) == 1 and len(current.received) == 1
    finally:
        for client in learner.policies:
            client.close()


def test_a_restarted_learner_at_the_base_version_lifts_a_servers_wait(stub_server):
    """The learner restarted without a checkpoint (version 0) while a server waits for the v5 the
    file still names: the learner's weights are the run's now, so it pushes them there."""
    waiting = _server(stub_server, version=0, awaiting=5)
    learner = _learner(0, [waiting.endpoint])
    try:
        learner.catch_up()
        assert learner.pushed == [[waiting.endpoint]]
    finally:
        learner.policies[0].close()


def test_no_catch_up_where_one_server_cannot_be_reached_alone(stub_server):
    behind = _server(stub_server, version=0, awaiting=5)
    learner = _learner(5, [behind.endpoint], method="nccl")  # its groups are set up at start
    try:
        learner.catch_up()
        assert learner.pushed == [] and behind.received == []
    finally:
        learner.policies[0].close()
