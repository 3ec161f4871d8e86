"""The policy server's registry re-exports vLLM's engine metrics (registered by vLLM in
prometheus_client's global registry) and nothing else of the global registry."""

from __future__ import annotations

from prometheus_client import REGISTRY, Gauge, generate_latest

from common.metrics import PolicyServerMetrics


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
