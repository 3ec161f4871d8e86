"""benchmarks/suite_durations.py: a pytest run's --durations=0 lines summed per module, setup apart from call."""

from __future__ import annotations

from benchmarks.suite_durations import by_module, parse, table

LOG = """\
============================= slowest durations =============================
490.10s call     tests/integration/test_server_restart.py::test_restart
60.00s setup    tests/integration/test_operations.py::test_a
400.00s call     tests/integration/test_operations.py::test_a
6.00s call     tests/integration/test_operations.py::test_b[x-1]
0.01s teardown tests/unit/x/test_y.py::test_z
========== 1190 passed, 2 skipped in 3174.20s (0:52:54) ==========
"""


def test_phases_add_up_per_module_with_setup_apart():
    phases, summary = parse(LOG.splitlines())
    assert summary.startswith("1190 passed, 2 skipped in 3174.20s")
    rows = {r["module"]: r for r in by_module(phases)}
    assert rows["tests/integration/test_operations.py"] == {
        "module": "tests/integration/test_operations.py",
        "tests": 2,
        "setup": 60.0,
        "call": 406.0,
        "teardown": 0.0,
        "total": 466.0,
    }
    assert [r["module"] for r in by_module(phases)][0] == "tests/integration/test_server_restart.py"  # slowest first
    text = table({"date": "d", "command": "c", "summary": summary, "modules": by_module(phases), "slowest": phases})
    assert "| tests/integration/test_operations.py | 2 | 60 | 406 | 466 | 48.7% |" in text
