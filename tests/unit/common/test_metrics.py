"""The policy server's registry re-exports vLLM's engine metrics (registered by vLLM in
prometheus_client's global registry) and nothing else of the global registry; the metrics page
keeps their names whatever format the scraper asks for."""

from __future__ import annotations

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
