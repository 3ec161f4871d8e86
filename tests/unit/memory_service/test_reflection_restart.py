"""A reflection in flight when its policy server restarts is asked again, not counted as a failed
attempt: with reflection_attempts=1, a counted failure would give the report up and lose its tips."""

from __future__ import annotations

import threading
import time

import numpy as np
import zmq

from common.server import dispatch
from memory_service.service import MemoryService
from pipeline.cli import given
from pipeline.config import load_config
from protocol import transport
from protocol.messages import Ack, EpisodeReport, GenerateRequest, GenerateResponse, Ping, Pong
from protocol.transport import bind_router, recv_request, send_reply
from tests.helpers import free_port, wait_for


def policy_server(endpoint: str, stop: threading.Event) -> None:
    """Takes the first generation and dies with it unanswered; restarted on the same endpoint, it
    answers probes (up for a moment) and generations."""
    ctx = zmq.Context.instance()
    first = bind_router(ctx, endpoint)
    while not first.poll(100):
        if stop.is_set():
            first.close(linger=0)
            return
    recv_request(first)  # the reflection's request: lost with this process
    first.close(linger=0)
    while True:  # ZeroMQ frees the port a moment after the close
        try:
            second = bind_router(ctx, endpoint)
            break
        except zmq.ZMQError:
            time.sleep(0.05)
    started = time.monotonic()
    try:
        while not stop.is_set():
            if not second.poll(100):
                continue
            request = recv_request(second)
            msg = request.message
            if isinstance(msg, Ping):
                reply = Pong(role="policy_server", policy_version=1, ready=True, uptime_s=time.monotonic() - started)
            else:
                assert isinstance(msg, GenerateRequest)
                ids = np.array([1, 2], np.int32)
                reply = GenerateResponse(msg.request_id, ids, np.zeros(2, np.float32), "Look first.", 1, "stop")
            send_reply(second, request.identity, reply)
    finally:
        second.close(linger=0)


def test_a_reflection_lost_to_a_restarted_policy_server_is_asked_again(tmp_path, monkeypatch):
    monkeypatch.setattr(transport, "LIVENESS_PROBE_S", 0.3)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    cfg = load_config(
        [
            f"run_dir={tmp_path}",
            "replay_buffer.tasks=[boil]",
            f"endpoints.policy_servers=[{endpoint}]",
            "memory_service.reflection_batch_size=1",
            "memory_service.reflection_attempts=1",
            "memory_service.reflection_timeout_s=60",
        ]
    )
    service = MemoryService(**given("empo2-memory-service", cfg))
    stop = threading.Event()
    server = threading.Thread(target=policy_server, args=(endpoint, stop), daemon=True)
    server.start()
    try:
        report = EpisodeReport("e1", "boil", 0, "boil water", 5.0, ["a kitchen"], ["look around"])
        assert isinstance(dispatch(service.handlers, report, service.metrics, limits=service.limits), Ack)
        threading.Thread(target=service._reflection_worker, daemon=True).start()
        assert wait_for(lambda: service.store.size("boil/0") > 0, timeout_s=30)
        assert not service.metrics.registry.get_sample_value("empo2_memory_service_reports_given_up_total")
    finally:
        stop.set()
        server.join(timeout=5)
        service.close()
