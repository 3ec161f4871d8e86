"""testing/fuzz.py's fuzz_endpoint against a real ZeroMQ server that answers everything with a Pong:
an exception in its loop (here the memory reading, once the hostile inputs' socket is open) reaches
the caller at once. It once left that socket open, and zmq's Context.term() waited for it: the CI's
live-run fuzz test hung for 80 minutes instead of failing."""

from __future__ import annotations

import threading

import pytest
import zmq

from protocol.codec import encode
from protocol.messages import Pong
from testing import fuzz
from tests.helpers import free_endpoint


@pytest.fixture
def pong_server():
    """pong_server(answers=None) -> the endpoint of a ROUTER answering any frames at all with a Pong
    (so every hostile input gets a reply), the first `answers` requests only when given."""
    ctx, started = zmq.Context(), []

    def start(answers: int | None = None) -> str:
        endpoint, stop = free_endpoint(), threading.Event()
        sock = ctx.socket(zmq.ROUTER)
        sock.bind(endpoint)

        def serve() -> None:
            answered = 0
            while not stop.is_set() and (answers is None or answered < answers):
                if sock.poll(10):
                    identity, *_ = sock.recv_multipart()
                    sock.send_multipart([identity, *encode(Pong(role="policy_server", policy_version=0, ready=True))])
                    answered += 1

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        started.append((stop, thread, sock))
        return endpoint

    yield start
    for stop, thread, sock in started:
        stop.set()
        thread.join(timeout=5)
        sock.close(linger=0)
    ctx.term()


def test_an_exception_in_the_loop_reaches_the_caller_instead_of_hanging(pong_server):
    endpoint = pong_server()
    readings = iter([100.0])  # the start's reading; the first check's raises

    def memory_mb() -> float:
        reading = next(readings, None)
        if reading is None:
            raise FileNotFoundError("/proc/4242/status")
        return reading

    outcome: list[BaseException | dict] = []

    def run() -> None:
        try:
            outcome.append(fuzz.fuzz_endpoint(endpoint, "policy_server", 10, 2, 0, lambda: True, memory_mb))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "fuzz_endpoint hung after its loop raised"
    assert len(outcome) == 1 and isinstance(outcome[0], FileNotFoundError), outcome


def test_a_server_that_answers_everything_is_fuzzed_to_the_end(pong_server):
    result = fuzz.fuzz_endpoint(pong_server(), "policy_server", 10, 5, 0, lambda: True, lambda: 100.0)
    assert result["inputs_sent"] == 10 and not result["crashed"] and result["replies"] == {"pong": 10}, result
    assert result["policy_version"] == {"before": 0, "after": 0}, result


def test_a_server_that_stops_answering_ends_the_fuzzing_at_once(pong_server, monkeypatch):
    """Not 200 inputs each waiting out its timeout (50 minutes in the live-run test): the first input
    not answered, with a valid request not answered either, ends it as `unresponsive`."""
    monkeypatch.setattr(fuzz, "REPLY_TIMEOUT_S", 0.3)
    endpoint = pong_server(answers=4)  # the readiness Ping and 3 inputs answered, then nothing
    result = fuzz.fuzz_endpoint(endpoint, "policy_server", 200, 100, 0, lambda: True, lambda: 100.0)
    assert result["unresponsive"] and not result["crashed"], result
    assert result["inputs_sent"] == 4 and result["replies"] == {"pong": 3, "no_reply": 1}, result
    assert result["valid_checks"] == {"failed": 1} and result["policy_version"]["after"] is None, result
