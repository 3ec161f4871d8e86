"""benchmarks/fuzz.py's short variant (issue 14): a few hundred hostile inputs (testing/fuzz.py)
against the real replay buffer and memory service processes, each started alone (testing/fuzz_server.py):
every input answered, no crash, the valid request after every 100 inputs still served, and the log
stays small (refusals are logged bounded and rate-limited)."""

from __future__ import annotations

import pytest

from testing.fuzz_server import fuzz_server
from tests.helpers import REPO

pytestmark = pytest.mark.integration
PORTS = {"replay_buffer": 32560, "memory_service": 32570}
METRICS_BASE = 32600


@pytest.mark.parametrize("socket", sorted(PORTS))
def test_hostile_inputs_are_refused_and_the_server_keeps_serving(socket, tmp_path):
    result = fuzz_server(
        socket, 300, 100, seed=1, port=PORTS[socket], metrics_base=METRICS_BASE, work=tmp_path, cwd=REPO
    )
    assert not result["crashed"], result
    assert result["inputs_sent"] == 300
    assert result["valid_checks"] == {"ok": 4}, result
    assert result["replies"].get("no_reply", 0) == 0, result
    refused = sum(n for reply, n in result["replies"].items() if reply.startswith("error:"))
    assert refused >= 200, result  # most inputs are wrong; some mutations stay valid (an empty sender, a new id)
    assert result["log_bytes"] < 1_000_000, result
