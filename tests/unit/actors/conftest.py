"""Stub servers for the actor tests: a real ZeroMQ ROUTER that answers with a function and records
what it was asked, always stopped after the test."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import zmq

from protocol import Message, bind_router, recv_request, send_reply
from tests.helpers import free_endpoint


class StubServer:
    """A ROUTER at `endpoint` answering every request with `answer(message)`; `received` holds
    the messages in arrival order."""

    def __init__(self, answer: Callable[[Message], Message], endpoint: str | None = None):
        self.endpoint = endpoint or free_endpoint()
        self.sock = bind_router(zmq.Context.instance(), self.endpoint)
        self.answer, self.received = answer, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self.sock.poll(10, zmq.POLLIN):
                request = recv_request(self.sock)
                self.received.append(request.message)
                send_reply(self.sock, request.identity, self.answer(request.message))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close(linger=0)


@pytest.fixture
def stub_server():
    """stub_server(answer, endpoint=None) -> a started StubServer, closed after the test."""
    started: list[StubServer] = []

    def start(answer: Callable[[Message], Message], endpoint: str | None = None) -> StubServer:
        started.append(StubServer(answer, endpoint))
        return started[-1]

    yield start
    for server in started:
        server.close()
