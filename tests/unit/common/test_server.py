"""common.server: a server's handler table answers each message type with its method, and every
server answers a type it does not serve the same way (ErrorReply "unexpected_kind", counted);
the synchronous request loop serves a table over a real ZeroMQ socket."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import zmq

from common.metrics import RoleMetrics
from common.server import dispatch, serve_requests
from protocol import Client, RemoteError
from protocol.messages import Ack, BatchRequest, ErrorReply, MemoryQuery, Ping, Pong

REJECTED = "empo2_test_server_messages_rejected_total"


def rejected(metrics: RoleMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value(REJECTED, {"reason": reason}) or 0.0


def test_dispatch_calls_the_handler_of_the_message_type_with_the_context():
    metrics = RoleMetrics("test_server")
    calls = []
    handlers = {Ping: lambda msg, *context: calls.append((msg, context)) or Ack(ref=msg.sender)}
    assert dispatch(handlers, Ping(sender="a"), metrics) == Ack(ref="a")
    assert dispatch(handlers, Ping(sender="b"), metrics, b"identity") == Ack(ref="b")
    assert calls == [(Ping(sender="a"), ()), (Ping(sender="b"), (b"identity",))]
    assert rejected(metrics, "unexpected_kind") == 0


def test_a_type_not_in_the_table_is_answered_unexpected_kind_and_counted():
    metrics = RoleMetrics("test_server")
    reply = dispatch({Ping: lambda msg: Ack(ref="")}, MemoryQuery(task="t", variation=0, state="s"), metrics)
    assert reply == ErrorReply(reason="unexpected_kind", detail="memory_query is not served here")
    assert rejected(metrics, "unexpected_kind") == 1


def test_under_curve_a_message_from_a_role_that_may_not_send_it_is_refused_wrong_role():
    """The sender's role comes from its CURVE key (protocol/security.py); only the learner's key takes
    batches, and without CURVE (sender None) the role is not checked."""
    metrics = RoleMetrics("test_server")
    handlers = {BatchRequest: lambda msg: Ack(ref="batch"), Ping: lambda msg: Ack(ref="ping")}
    request = BatchRequest(learner_version=0, num_groups=1, max_staleness=1)
    assert dispatch(handlers, request, metrics, sender="learner") == Ack(ref="batch")
    assert dispatch(handlers, request, metrics, sender=None) == Ack(ref="batch")
    reply = dispatch(handlers, request, metrics, sender="env_actor")
    assert isinstance(reply, ErrorReply) and reply.reason == "wrong_role" and "env_actor" in reply.detail
    assert dispatch(handlers, Ping(sender="x"), metrics, sender="env_actor") == Ack(ref="ping")  # anyone may ping
    assert rejected(metrics, "wrong_role") == 1


def test_serve_requests_answers_through_the_table():
    metrics = RoleMetrics("test_server")
    endpoint = f"inproc://server-{uuid.uuid4().hex}"
    handlers = {Ping: lambda msg: Pong(role=msg.sender, policy_version=3, ready=True)}
    threading.Thread(target=serve_requests, args=(endpoint, handlers, metrics), daemon=True).start()
    client = Client(zmq.Context.instance(), endpoint, timeout_s=5)
    try:
        assert client.call(Ping(sender="me")) == Pong(role="me", policy_version=3, ready=True)
        with pytest.raises(RemoteError) as info:
            client.call(MemoryQuery(task="t", variation=0, state="s"))
        assert info.value.reason == "unexpected_kind"
    finally:
        client.close()
    assert rejected(metrics, "unexpected_kind") == 1
    assert metrics.registry.get_sample_value("empo2_test_server_messages_received_total", {"kind": "ping"}) == 1


def test_queries_waiting_together_are_answered_by_one_batch_call_each_client_its_own_reply():
    """The memory service's way (memory_service.query_batch): the first query is served alone while
    four more arrive; those four (one of them refused at the door, unknown task) go through the door one
    by one and the three admitted are answered by one call; a Ping met on the way is answered at once."""
    from protocol.messages import DoorLimits, MemoryResult
    from tests.helpers import free_endpoint

    metrics = RoleMetrics("test_server")
    endpoint = free_endpoint()
    batches, first_served, go_on = [], threading.Event(), threading.Event()

    def batch(queries):
        batches.append([q.state for q in queries])
        if len(batches) == 1:
            first_served.set()
            go_on.wait(5)  # the others queue up meanwhile
        return [MemoryResult(tips=[q.state], scores=[1.0], count=1) for q in queries]

    handlers = {
        MemoryQuery: lambda q: batch([q])[0],
        Ping: lambda msg: Pong(role=msg.sender, policy_version=0, ready=True),
    }
    limits = DoorLimits(0, frozenset({"t"}), 0, 0, 0, 0, 0)
    serve = threading.Thread(
        target=serve_requests,
        args=(endpoint, handlers, metrics, limits),
        kwargs={"batched": {MemoryQuery: batch}, "max_batch": 8},
        daemon=True,
    )
    serve.start()
    clients = [Client(zmq.Context.instance(), endpoint, timeout_s=10) for _ in range(6)]
    replies = {}

    def ask(i, msg):
        try:
            replies[i] = clients[i].call(msg)
        except RemoteError as exc:
            replies[i] = exc.reason

    def query(i, task="t"):
        return threading.Thread(target=ask, args=(i, MemoryQuery(task=task, variation=0, state=f"s{i}")))

    try:
        threads = [query(0)]
        threads[0].start()
        assert first_served.wait(5)
        threads += [query(1), query(2), query(3, task="unknown"), query(4)]
        threads.append(threading.Thread(target=ask, args=(5, Ping(sender="p"))))
        for t in threads[1:]:
            t.start()
        time.sleep(0.5)  # all five are waiting on the server's socket
        go_on.set()
        for t in threads:
            t.join(10)
    finally:
        for c in clients:
            c.close()
    assert batches[0] == ["s0"] and sorted(batches[1]) == ["s1", "s2", "s4"] and len(batches) == 2
    assert {i: r.tips for i, r in replies.items() if isinstance(r, MemoryResult)} == {
        0: ["s0"],
        1: ["s1"],
        2: ["s2"],
        4: ["s4"],
    }
    assert replies[3] == "task"  # refused at the door: a task this server does not train
    assert replies[5] == Pong(role="p", policy_version=0, ready=True)
