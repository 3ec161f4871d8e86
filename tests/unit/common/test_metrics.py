"""The policy server's registry re-exports vLLM's engine metrics (registered by vLLM in
prometheus_client's global registry) and nothing else of the global registry; the metrics page
keeps their names whatever format the scraper asks for. The code that reads the metrics from a
scrape names them only through common/metrics.py's names, each one a metric some role exports."""

from __future__ import annotations

import ast
import re
import socket
import struct
import time
import urllib.request
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, generate_latest

import common.metrics
from common.metrics import (
    ROLE_METRICS,
    PolicyServerMetrics,
    exported_families,
    exported_sample_names,
    serve_metrics,
)
from tests.helpers import REPO, free_port

# Where metrics are read (and written): every package of ours. Not common/metrics.py, where the names are
# defined, nor the Grafana board's PromQL (deploy/monitoring/make_dashboard.py), checked against the
# exported names by tests/unit/deploy/test_deploy_files.py like the alert rules by test_rules.py.
PACKAGES = (
    "actors",
    "benchmarks",
    "common",
    "deploy",
    "evaluation",
    "learner",
    "memory_service",
    "pipeline",
    "protocol",
    "replay_buffer",
    "spa",
)
NOT_READERS = {REPO / "common" / "metrics.py", REPO / "deploy" / "monitoring" / "make_dashboard.py"}


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


def metric_literals(path: Path, pattern: re.Pattern) -> list[str]:
    """The string literals of a module that match `pattern`, its docstrings (and other bare strings) aside."""
    tree = ast.parse(path.read_text(), str(path))
    bare = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [
        f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in bare
        and pattern.search(node.value)
    ]


def test_readers_name_only_metrics_that_common_metrics_defines():
    """A renamed metric cannot leave a reader (empo2-status, the launcher's progress line, the benchmarks)
    scraping a name no role exports any more: each name common/metrics.py gives the readers is exported,
    and no other module spells out a metric's name."""
    samples, families = exported_sample_names(), exported_families()
    names = {k: v for k, v in vars(common.metrics).items() if isinstance(v, str) and v.startswith("empo2_")}
    assert "LEARNER_STEPS" in names
    for constant, name in names.items():
        # a counter or gauge as a scrape shows it, or a histogram's family (its readers add _sum or _count)
        assert name in samples or f"{name}_count" in families.get(name, []), f"{constant}: no role exports {name}"

    roles = [cls().role for cls in ROLE_METRICS] + ["launch"]
    metric = re.compile(rf"\bempo2_({'|'.join(roles)})_")
    files = [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py")) if p not in NOT_READERS]
    assert REPO / "deploy" / "status.py" in files
    spelled = [hit for path in files for hit in metric_literals(path, metric)]
    assert spelled == [], "name these metrics through common/metrics.py's names:\n" + "\n".join(spelled)
