"""Degradation: with the memory service down, an actor's turn goes without tips within the
timeout, later turns skip it at once until the retry delay passes, and it recovers."""

from __future__ import annotations

import socket
import threading
import time

import zmq

from actors.env_actor import ActorProcess
from pipeline.config import load_config
from protocol import bind_router, recv_request, send_reply
from protocol.messages import MemoryResult


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_memory_down_falls_back_then_recovers():
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    cfg = load_config(
        [f"endpoints.memory_service={endpoint}", "env_actor.memory_timeout_s=0.3", "env_actor.memory_retry_after_s=1.0"]
    )
    actor = ActorProcess(cfg)

    t0 = time.monotonic()
    assert actor._retrieve("t", 0, "state") is None  # nothing listens: fallback after the timeout
    first = time.monotonic() - t0
    assert 0.25 < first < 2.0
    t0 = time.monotonic()
    assert actor._retrieve("t", 0, "state") is None  # within the retry delay: no waiting at all
    assert time.monotonic() - t0 < 0.05

    ctx = zmq.Context.instance()
    server = bind_router(ctx, endpoint)

    def serve_one():
        request = recv_request(server)
        send_reply(server, request.identity, MemoryResult(tips=["try the kitchen"], scores=[50.0], count=1))

    thread = threading.Thread(target=serve_one)
    thread.start()
    try:
        time.sleep(1.1)  # the retry delay has passed: the actor asks again and gets tips
        assert actor._retrieve("t", 0, "state") == (["try the kitchen"], 1)
    finally:
        thread.join(timeout=5)
        server.close(linger=0)
        actor.memory.close()


def test_episode_reports_skip_a_down_memory_service():
    """A report that times out marks the service down: the next episodes' reports are dropped at
    once (counted) instead of each waiting out the timeout."""
    from types import SimpleNamespace

    cfg = load_config(
        [
            f"endpoints.memory_service=tcp://127.0.0.1:{_free_port()}",
            "env_actor.memory_timeout_s=0.3",
            "env_actor.memory_retry_after_s=30",
        ]
    )
    actor = ActorProcess(cfg)
    episode = SimpleNamespace(episode_id="e", task="t", variation=0, score=0.0, observations=["o"], actions=["a"])
    try:
        t0 = time.monotonic()
        actor._report_to_memory(episode, "task")  # nothing listens: dropped after the timeout
        assert 0.25 < time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        actor._report_to_memory(episode, "task")
        assert time.monotonic() - t0 < 0.05
        assert actor._retrieve("t", 0, "state") is None  # retrieval skips it as well
        assert actor.metrics.errors.labels("memory_report")._value.get() == 2
    finally:
        actor.memory.close()
