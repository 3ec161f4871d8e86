"""A hung policy server (issue 14: SIGSTOP) is detected by the generation timeout: the request
is retried on another server, and the requests after it go there at once, not each waiting out
the timeout on the hung one. Real ZeroMQ sockets; the hung server is a stub that stops answering."""

from __future__ import annotations

import threading
import time

import numpy as np

from actors.env_actor.worker import EnvWorker
from pipeline.cli import given
from pipeline.config import load_config
from protocol.messages import GenerateResponse


def response(msg) -> GenerateResponse:
    return GenerateResponse(
        request_id=msg.request_id,
        token_ids=np.array([1], np.int32),
        logprobs=np.array([-0.1], np.float32),
        text="look around",
        policy_version=0,
        finish_reason="stop",
    )


def test_requests_fail_over_from_a_hung_server_to_a_live_one(stub_server):
    resume = threading.Event()

    def hung(msg):
        resume.wait(10)  # like a SIGSTOPped process: no answer until it is continued
        return response(msg)

    stopped, live = stub_server(hung), stub_server(response)
    cfg = load_config(
        [
            f"endpoints.policy_servers=[{stopped.endpoint},{live.endpoint}]",
            "env_actor.generate_timeout_s=0.5",
            "env_actor.policy_retry_after_s=60",
        ]
    )
    worker = EnvWorker(**given("empo2-env-actor", cfg))
    try:
        t0 = time.monotonic()
        for seed in range(6):
            assert worker.generate(np.array([1, 2, 3], np.int32), seed).text == "look around"
        elapsed = time.monotonic() - t0
        timeouts = worker.metrics.registry.get_sample_value("empo2_env_actor_errors_total", {"where": "timeout"})
        assert timeouts == 1  # only the first request to the hung server waited out the timeout
        assert elapsed < 3.0
        assert len(live.received) == 6 and len(stopped.received) == 1
    finally:
        resume.set()
        worker.close()
