"""A lone server fuzzed: one role's server started on its own in a run directory, sent hostile
inputs (testing/fuzz.py) with a valid request after every few hundred, and always stopped. What
benchmarks/fuzz.py measures per socket and tests/integration/test_fuzz_sockets.py checks.

The replay buffer reads ScienceWorld's variation lists at start-up; the memory service loads its
embedder and, with no policy server listening, keeps the reports it queues for reflection; the
policy server loads a vLLM engine on the embedded model, and the inputs include weight chunks and
weight files, which it must refuse without touching the weights.
"""

from __future__ import annotations

from pathlib import Path

from common.process import spawn_command, status_mb, stop_group
from testing.fuzz import fuzz_endpoint

SOCKETS = {  # command, the override that sets its endpoint
    "replay_buffer": ("empo2-replay-buffer", "endpoints.replay_buffer={}"),
    "memory_service": ("empo2-memory-service", "endpoints.memory_service={}"),
    "policy_server": ("empo2-policy-server", "endpoints.policy_servers=[{}]"),
}


def fuzz_server(
    socket: str,
    inputs: int,
    check_every: int,
    seed: int,
    port: int,
    metrics_base: int,
    work: Path,
    cwd: Path | None = None,
) -> dict:
    """Start the `socket`'s server in `work` (its endpoint on `port`), fuzz it (fuzz_endpoint), stop
    it; the figures, with its exit code (None: it was still running) and the size of its log."""
    command, endpoint_override = SOCKETS[socket]
    endpoint = f"tcp://127.0.0.1:{port}"
    overrides = [
        f"run_dir={work / socket}",
        endpoint_override.format(endpoint),
        f"metrics.base_port={metrics_base}",
        # the memory service's reflections: none (nothing listens)
        *([] if socket == "policy_server" else ["endpoints.policy_servers=[tcp://127.0.0.1:1]"]),
        # a lone buffer serves batches to any client, so mutated BatchRequests reach the batch path
        # (with neither CURVE nor a learner token it would refuse them all at the door: issue 26)
        *(["security.insecure=true"] if socket == "replay_buffer" else []),
    ]
    log_path = work / f"{socket}.log"
    proc = spawn_command(command, overrides, log_path, cwd=cwd)
    try:
        result = fuzz_endpoint(
            endpoint, socket, inputs, check_every, seed, lambda: proc.poll() is None, lambda: status_mb(proc.pid)
        )
        exit_code = proc.poll()
    finally:
        stop_group(proc, grace_s=20)
    return {**result, "exit_code": exit_code, "log_bytes": log_path.stat().st_size}
