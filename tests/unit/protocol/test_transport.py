"""protocol.transport over real ZeroMQ sockets (inproc and loopback TCP, no external services)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import numpy as np
import pytest
import zmq

from protocol import transport
from protocol.codec import ProtocolError, decode, encode
from protocol.messages import Ack, ErrorReply, GenerateRequest, Ping, Pong
from protocol.transport import (
    Client,
    RemoteError,
    Request,
    RequestLost,
    RequestTimeout,
    bind_router,
    recv_request,
    send_reply,
    wait_until_ready,
)
from tests.helpers import wait_for


class Server:
    """bind_router + recv_request/send_reply in a thread; `handler(request)` returns the reply
    (or None for no reply). Records what it received and every ProtocolError it raised."""

    def __init__(self, ctx: zmq.Context, endpoint: str, handler: Callable[[Request], object], max_bytes=None):
        self.sock = bind_router(ctx, endpoint)
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.handler = handler
        self.max_bytes = max_bytes
        self.requests: list[Request] = []
        self.errors: list[ProtocolError] = []
        self.crash: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.sock.poll(10, zmq.POLLIN):
                    continue
                try:
                    if self.max_bytes is None:
                        request = recv_request(self.sock)
                    else:
                        request = recv_request(self.sock, self.max_bytes)
                except ProtocolError as exc:
                    self.errors.append(exc)
                    continue
                self.requests.append(request)
                reply = self.handler(request)
                if reply is not None:
                    send_reply(self.sock, request.identity, reply)
        except BaseException as exc:  # surfaced by close()
            self.crash = exc

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        assert not self._thread.is_alive(), "server thread did not stop"
        self.sock.close(linger=0)
        if self.crash is not None:
            raise self.crash


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def serve(ctx):
    servers: list[Server] = []

    def start(handler, endpoint: str | None = None, max_bytes=None) -> Server:
        server = Server(ctx, endpoint or f"inproc://test-{uuid.uuid4().hex}", handler, max_bytes)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def make_client(ctx):
    clients: list[Client] = []

    def make(endpoint: str, timeout_s: float = 2.0) -> Client:
        client = Client(ctx, endpoint, timeout_s=timeout_s)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def raw_dealer(ctx):
    socks: list[zmq.Socket] = []

    def make(endpoint: str) -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        socks.append(sock)
        return sock

    yield make
    for sock in socks:
        sock.close(linger=0)


def echo_pong(request: Request) -> Pong:
    return Pong(role=request.message.sender, policy_version=len(request.message.sender), ready=True)


# ---------------------------------------------------------------------------------- calls


@pytest.mark.parametrize("endpoint", ["inproc://call-test", "tcp://127.0.0.1:*"], ids=["inproc", "tcp"])
def test_call_gets_the_reply_from_a_router(serve, make_client, endpoint):
    server = serve(echo_pong, endpoint)
    client = make_client(server.endpoint)
    reply = client.call(Ping(sender="actor-12"))
    assert reply == Pong(role="actor-12", policy_version=8, ready=True)
    assert [r.message for r in server.requests] == [Ping(sender="actor-12")]


def test_consecutive_calls_each_get_their_own_reply(serve, make_client):
    server = serve(echo_pong)
    client = make_client(server.endpoint)
    roles = [client.call(Ping(sender=s)).role for s in ("a", "bb", "ccc")]
    assert roles == ["a", "bb", "ccc"]
    assert len({r.identity for r in server.requests}) == 1  # one connection, reused


def test_request_arrays_reach_the_server_intact(serve, make_client):
    server = serve(lambda req: Ack(ref=str(req.message.prompt_token_ids.tolist())))
    client = make_client(server.endpoint)
    msg = GenerateRequest(
        request_id="r1", prompt_token_ids=np.array([5, 6, 7], np.int32), max_tokens=8, temperature=1.0, seed=1
    )
    assert client.call(msg) == Ack(ref="[5, 6, 7]", detail="")
    received = server.requests[0].message
    assert received.prompt_token_ids.dtype == np.int32


# ------------------------------------------------------------------------------- timeouts


def test_recv_times_out_with_request_timeout_naming_the_endpoint(serve, make_client):
    server = serve(lambda req: None)  # never answers
    client = make_client(server.endpoint)
    with pytest.raises(RequestTimeout) as info:
        client.call(Ping(sender="x"), timeout_s=0.2)
    assert server.endpoint in str(info.value) and "within 0.2s" in str(info.value)
    # the request was delivered: what timed out is the wait for its reply
    assert wait_for(lambda: [r.message for r in server.requests] == [Ping(sender="x")])


def test_a_request_lost_to_a_restarted_server_fails_at_once_not_at_its_timeout(ctx, serve):
    """The server dies with the request in flight and comes back on the same endpoint: the client's
    probe finds it up for less time than the request has waited, and gives the request up."""
    first = serve(lambda req: None, "tcp://127.0.0.1:*")  # takes the request, never answers
    endpoint = first.endpoint
    restarted_at = []

    def pong_only(req: Request) -> Pong | None:
        if isinstance(req.message, Ping):
            return Pong(role="r", policy_version=0, ready=True, uptime_s=time.monotonic() - restarted_at[-1])
        return None

    def restart() -> None:
        time.sleep(0.5)
        first.close()
        for _ in range(100):  # a closed socket's port is freed by ZeroMQ's I/O thread, a moment later
            restarted_at.append(time.monotonic())
            try:
                serve(pong_only, endpoint)
                return
            except zmq.ZMQError:
                time.sleep(0.05)

    client = Client(ctx, endpoint, timeout_s=20.0, probe_after_s=0.2)
    threading.Thread(target=restart, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(RequestLost, match="restarted"):
        client.call(Ack(ref="in flight"))
    assert time.monotonic() - start < 10  # not the 20 s timeout
    client.close()


def test_a_server_up_all_along_is_waited_for_until_it_answers(ctx, serve):
    def handler(req: Request):
        if isinstance(req.message, Ping):
            return Pong(role="r", policy_version=0, ready=True, uptime_s=1000.0)
        time.sleep(1.0)  # a slow answer (a long generation)
        return Ack(ref="done")

    server = serve(handler, "tcp://127.0.0.1:*")
    client = Client(ctx, server.endpoint, timeout_s=30.0, probe_after_s=0.2)
    assert client.call(Ack(ref="slow")) == Ack(ref="done")
    client.close()


def test_a_server_that_does_not_answer_the_probe_is_waited_for_until_the_timeout(ctx, serve):
    server = serve(lambda req: None)  # stopped, or busy: no Pong either
    client = Client(ctx, server.endpoint, timeout_s=1.0, probe_after_s=0.1)
    start = time.monotonic()
    with pytest.raises(RequestTimeout) as info:
        client.call(Ack(ref="x"))
    assert not isinstance(info.value, RequestLost) and time.monotonic() - start >= 1.0
    assert any(isinstance(r.message, Ping) for r in server.requests)  # it was asked
    client.close()


def test_late_reply_to_a_timed_out_request_is_not_taken_for_the_next_reply(serve, make_client):
    timed_out = threading.Event()
    late_sent = threading.Event()

    def handler(request: Request):
        if request.message.sender == "first":
            assert timed_out.wait(5)
            send_reply(server.sock, request.identity, Pong(role="late", policy_version=1, ready=True))
            late_sent.set()
            return None
        return Pong(role="fresh", policy_version=2, ready=True)

    server = serve(handler)
    client = make_client(server.endpoint)
    with pytest.raises(RequestTimeout):
        client.call(Ping(sender="first"), timeout_s=0.1)
    timed_out.set()
    assert late_sent.wait(5)
    reply = client.call(Ping(sender="second"), timeout_s=2.0)
    assert reply == Pong(role="fresh", policy_version=2, ready=True)
    # the client threw its socket away: the second request came over a new connection
    assert [r.message.sender for r in server.requests] == ["first", "second"]
    assert server.requests[0].identity != server.requests[1].identity


def test_client_is_usable_again_after_a_timeout(serve, make_client):
    calls = []

    def handler(request: Request):
        calls.append(request.message.sender)
        return None if len(calls) == 1 else Pong(role="ok", policy_version=0, ready=True)

    server = serve(handler)
    client = make_client(server.endpoint)
    with pytest.raises(RequestTimeout):
        client.call(Ping(sender="a"), timeout_s=0.1)
    assert client.call(Ping(sender="b")).role == "ok"
    assert calls == ["a", "b"]


# --------------------------------------------------------------------------------- errors


def test_malformed_raw_request_raises_on_the_server_and_answers_error_reply(serve, raw_dealer):
    server = serve(echo_pong)
    sock = raw_dealer(server.endpoint)
    sock.send_multipart([b"not_a_kind", b"\x80"])
    assert sock.poll(2000, zmq.POLLIN), "no ErrorReply came back"
    reply = decode(sock.recv_multipart())
    assert isinstance(reply, ErrorReply)
    assert reply.reason == "unknown_kind"
    assert "not_a_kind" in reply.detail
    assert wait_for(lambda: len(server.errors) == 1)
    assert [e.reason for e in server.errors] == ["unknown_kind"]
    assert server.requests == []  # never reached the handler


def test_garbage_header_from_a_raw_dealer_is_answered_with_malformed(serve, raw_dealer):
    server = serve(echo_pong)
    sock = raw_dealer(server.endpoint)
    sock.send_multipart([b"ping", b"\xc1\xc1"])
    assert sock.poll(2000, zmq.POLLIN)
    reply = decode(sock.recv_multipart())
    assert isinstance(reply, ErrorReply) and reply.reason == "malformed"
    assert wait_for(lambda: len(server.errors) == 1)
    assert [e.reason for e in server.errors] == ["malformed"]


def test_invalid_request_surfaces_as_remote_error_with_the_reason(serve, make_client):
    server = serve(echo_pong)
    client = make_client(server.endpoint)
    empty = GenerateRequest(
        request_id="r", prompt_token_ids=np.zeros(0, np.int32), max_tokens=8, temperature=1.0, seed=0
    )
    with pytest.raises(RemoteError) as info:
        client.call(empty)
    assert info.value.reason == "invalid"
    assert "empty prompt" in str(info.value)
    assert wait_for(lambda: len(server.errors) == 1)
    assert [e.reason for e in server.errors] == ["invalid"]
    assert server.requests == []
    # the connection stays usable after a rejected request
    assert client.call(Ping(sender="ok")).role == "ok"


def test_raw_malformed_request_surfaces_through_client_recv_as_remote_error(serve, make_client, monkeypatch):
    server = serve(echo_pong)
    client = make_client(server.endpoint)
    # the request's encoding gets a frame no array references (the server's reply is encoded as usual):
    # bad frames on the wire through the client's own send
    monkeypatch.setattr(
        transport, "encode", lambda msg: [*encode(msg), b"unreferenced"] if isinstance(msg, Ping) else encode(msg)
    )
    client.send(Ping(sender="x"))
    with pytest.raises(RemoteError) as info:
        client.recv(timeout_s=2.0)
    assert info.value.reason == "malformed"
    assert wait_for(lambda: len(server.errors) == 1)
    assert [e.reason for e in server.errors] == ["malformed"]


def test_request_over_the_server_byte_limit_is_rejected_as_too_large(serve, make_client):
    server = serve(echo_pong, max_bytes=256)
    client = make_client(server.endpoint)
    big = GenerateRequest(
        request_id="r", prompt_token_ids=np.arange(100, dtype=np.int32), max_tokens=8, temperature=1.0, seed=0
    )
    with pytest.raises(RemoteError) as info:
        client.call(big)
    assert info.value.reason == "too_large"
    assert client.call(Ping(sender="small")).role == "small"


def test_error_reply_from_the_application_is_raised_as_remote_error(serve, make_client):
    server = serve(lambda req: ErrorReply(reason="unexpected_kind", detail="ping is not served here"))
    client = make_client(server.endpoint)
    with pytest.raises(RemoteError) as info:
        client.call(Ping(sender="x"))
    assert info.value.reason == "unexpected_kind"
    assert "not served here" in str(info.value)


def test_reply_to_a_vanished_peer_is_dropped_without_raising(ctx, make_client):
    endpoint = f"inproc://test-{uuid.uuid4().hex}"
    sock = bind_router(ctx, endpoint)
    try:
        send_reply(sock, b"\x00nobody", Ack(ref="lost"))  # ROUTER_MANDATORY off: dropped, nothing raised
        # the socket serves on, and the dropped reply reaches no one: the next client gets its own reply
        client = make_client(endpoint)
        client.send(Ping(sender="next"))
        assert sock.poll(2000, zmq.POLLIN), "the request never arrived"
        request = recv_request(sock)
        send_reply(sock, request.identity, Pong(role="next", policy_version=0, ready=True))
        assert client.recv() == Pong(role="next", policy_version=0, ready=True)
    finally:
        sock.close(linger=0)


# ------------------------------------------------------------------------------ handshake


def test_wait_until_ready_pings_until_the_server_is_ready(serve, make_client):
    def handler(request: Request) -> Pong:
        ready = len(server.requests) >= 2
        return Pong(role="policy_server", policy_version=7 if ready else -1, ready=ready)

    server = serve(handler)
    client = make_client(server.endpoint)
    waits: list[float] = []
    pong = wait_until_ready(client, "env_actor-0", timeout_s=5.0, poll_s=0.25, on_wait=waits.append)
    assert pong == Pong(role="policy_server", policy_version=7, ready=True)
    pings = [r.message for r in server.requests]
    assert len(pings) >= 2 and set(map(repr, pings)) == {repr(Ping(sender="env_actor-0"))}
    assert len(waits) == len(pings) - 1  # on_wait between attempts, with the time left
    assert all(0 < w <= 5.0 for w in waits)


def test_wait_until_ready_returns_at_once_when_ready(serve, make_client):
    server = serve(lambda req: Pong(role="replay_buffer", policy_version=0, ready=True))
    client = make_client(server.endpoint)
    waits: list[float] = []
    pong = wait_until_ready(client, "learner", timeout_s=5.0, poll_s=2.0, on_wait=waits.append)
    assert pong.role == "replay_buffer"
    assert waits == [] and len(server.requests) == 1


def test_wait_until_ready_raises_timeout_naming_the_endpoint_when_nothing_answers(make_client):
    endpoint = f"inproc://nobody-{uuid.uuid4().hex}"  # never bound
    client = make_client(endpoint)
    waits: list[float] = []
    with pytest.raises(TimeoutError) as info:
        wait_until_ready(client, "x", timeout_s=1.0, poll_s=0.05, on_wait=waits.append)
    assert type(info.value) is TimeoutError  # not the per-call RequestTimeout
    assert endpoint in str(info.value) and "not ready" in str(info.value)
    # it kept pinging while time was left, then gave up: the time left only went down
    assert waits and all(0 < w <= 1.0 for w in waits) and waits == sorted(waits, reverse=True)


def test_wait_until_ready_raises_timeout_when_the_server_never_becomes_ready(serve, make_client):
    server = serve(lambda req: Pong(role="policy_server", policy_version=-1, ready=False))
    client = make_client(server.endpoint)
    with pytest.raises(TimeoutError) as info:
        wait_until_ready(client, "x", timeout_s=0.3, poll_s=0.05)
    assert type(info.value) is TimeoutError
    assert server.endpoint in str(info.value)
    assert len(server.requests) >= 2
