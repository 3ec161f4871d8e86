"""A stalled weight push (issue 14: a SIGSTOPped policy server) times out with a clear error and
is retried: the whole update is sent again, learner.push_attempts times in all. Real ZeroMQ
sockets against a stub server that stops answering for a while."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
import zmq

from learner import weight_push
from learner.weight_push import PushStalled, build_chunks, push_weight_file, push_weights
from protocol import Client, bind_router, recv_request, send_reply
from protocol.messages import ErrorReply, WeightChunk, WeightUpdateAck
from tests.helpers import free_endpoint


class StallingServer:
    """Answers weight updates; the first `stall` requests get no answer in time (hung), the next
    `not_ready` ones are answered not_ready (its engine starting)."""

    def __init__(self, stall: int, not_ready: int = 0):
        self.endpoint = free_endpoint()
        self.sock = bind_router(zmq.Context.instance(), self.endpoint)
        self.stall, self.not_ready, self.received, self._stop = stall, not_ready, [], threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(10, zmq.POLLIN):
                continue
            request = recv_request(self.sock)
            self.received.append(request.message)
            if len(self.received) <= self.stall:
                continue  # hung: never answers this one
            if len(self.received) <= self.stall + self.not_ready:
                send_reply(self.sock, request.identity, ErrorReply(reason="not_ready", detail="engine still starting"))
                continue
            msg = request.message
            last = not isinstance(msg, WeightChunk) or msg.chunk_index == msg.num_chunks - 1
            ack = WeightUpdateAck(version=msg.version, chunk_index=getattr(msg, "chunk_index", 0), applied=last)
            send_reply(self.sock, request.identity, ack)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close(linger=0)


@pytest.fixture
def server_factory():
    servers = []

    def make(stall: int, not_ready: int = 0) -> StallingServer:
        servers.append(StallingServer(stall, not_ready))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def chunks(version: int) -> list[WeightChunk]:
    return build_chunks([("w", torch.ones(4, 4)), ("b", torch.zeros(4))], version, chunk_bytes=64)


def test_a_stalled_push_is_sent_again_and_goes_through(server_factory, caplog):
    server = server_factory(stall=1)
    client = Client(zmq.Context.instance(), server.endpoint, timeout_s=0.3)
    try:
        with caplog.at_level(logging.WARNING, logger="learner.weight_push"):
            push_weights([client], chunks(3), timeout_s=0.3, attempts=3)
        assert "weight push of v3 to" in caplog.text and "stalled" in caplog.text and "attempt 1 of 3" in caplog.text
        assert len(server.received) == 1 + 2  # the stalled first chunk, then both chunks again
    finally:
        client.close()


def test_a_push_that_stalls_every_attempt_fails_naming_the_server_and_the_keys(server_factory):
    server = server_factory(stall=100)
    client = Client(zmq.Context.instance(), server.endpoint, timeout_s=0.2)
    try:
        t0 = time.monotonic()
        with pytest.raises(PushStalled, match=r"v4 to tcp://127.0.0.1:\d+ stalled.*2 attempts.*learner.push_attempts"):
            push_weight_file([client], "/dev/shm/x.safetensors", "00", version=4, timeout_s=0.2, attempts=2)
        assert time.monotonic() - t0 < 2
        assert len(server.received) == 2
    finally:
        client.close()


def test_a_server_starting_its_engine_is_sent_the_update_again_until_it_takes_it(server_factory, monkeypatch):
    """A restarted policy server binds its socket before its engine is up and answers not_ready
    meanwhile: the push waits for it (every NOT_READY_RETRY_S) instead of failing the learner, and
    no attempt is spent; a server not ready for longer than the push timeout stalls the push."""
    monkeypatch.setattr(weight_push, "NOT_READY_RETRY_S", 0.01)
    server = server_factory(stall=0, not_ready=3)
    client = Client(zmq.Context.instance(), server.endpoint, timeout_s=1.0)
    try:
        push_weights([client], chunks(5), timeout_s=1.0, attempts=1)
        assert len(server.received) == 3 + 2  # the first chunk refused three times, then both taken
    finally:
        client.close()
    never = server_factory(stall=0, not_ready=10_000)
    client = Client(zmq.Context.instance(), never.endpoint, timeout_s=1.0)
    try:
        with pytest.raises(PushStalled, match="stayed not ready for 0s"):
            push_weight_file([client], "/dev/shm/x.safetensors", "00", version=6, timeout_s=0.2, attempts=1)
    finally:
        client.close()
