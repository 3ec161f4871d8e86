"""The policy server's registry re-exports vLLM's engine metrics (registered by vLLM in
prometheus_client's global registry) and nothing else of the global registry; the metrics page
keeps their names whatever format the scraper asks for."""

from __future__ import annotations

import socket
import struct
import time
import urllib.request

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, generate_latest

from common.metrics import PolicyServerMetrics, serve_metrics
from tests.helpers import free_port


def test_vllm_engine_metrics_are_on_the_policy_server_registry():
    metrics = PolicyServerMetrics()
    assert b"vllm:" not in generate_latest(metrics.registry)  # no engine yet: nothing of vLLM's
    running = Gauge("vllm:num_requests_running", "Running requests", ["model_name"])  # as vLLM's logger does
    try:
        running.labels("m").set(3)
        text = generate_latest(metrics.registry).decode()
    finally:
        REGISTRY.unregister(running)
    assert 'vllm:num_requests_running{model_name="m"} 3.0' in text
    assert "empo2_policy_server_generated_tokens_total" in text
    assert "python_gc" not in text and "process_cpu" not in text  # the global registry's own collectors stay out


def test_the_page_is_text_with_colon_names_even_when_openmetrics_is_asked_for():
    """Prometheus asks for OpenMetrics, whose writer (prometheus_client 0.26) would store vLLM's
    `vllm:x_total` as `vllm_x_total`: the page is the text format for every scraper."""
    registry = CollectorRegistry()
    Counter("vllm:generation_tokens", "Generated tokens", registry=registry).inc(5)
    port = free_port()
    server = serve_metrics(registry, "127.0.0.1", port)
    try:
        accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"  # Prometheus 2.42's
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=5) as resp:
            content_type, body = resp.headers["Content-Type"], resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "vllm:generation_tokens_total 5.0" in body and "vllm_generation_tokens" not in body


def test_a_scraper_that_hangs_up_leaves_no_traceback_and_the_next_scrape_is_served(capfd):
    """A scraper gives up on a process that was stopped or busy (SIGSTOP, a long step) and closes
    its connection: the page's write fails on the closed socket. That is the scraper's business,
    not an error of the role: no traceback in the role's log, and the next scrape is answered."""
    registry = CollectorRegistry()
    wide = Gauge("wide", "A page larger than the socket buffers", ["i"], registry=registry)
    for i in range(40_000):
        wide.labels(str(i)).set(i)
    port = free_port()
    server = serve_metrics(registry, "127.0.0.1", port)
    try:
        for _ in range(3):
            client = socket.create_connection(("127.0.0.1", port), timeout=5)
            client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.3)  # the page is being written, into buffers the client never reads
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # a reset, as a scraper's timeout leaves it
        time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert b'wide{i="39999"} 39999.0' in resp.read()
    finally:
        server.shutdown()
        server.server_close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err[-2000:]
