"""Committed benchmark results read the same on any machine: their command is relative to the
repository, and no path of the machine that ran them is recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import record
from benchmarks.record import REPO, command_line

RESULTS = sorted((REPO / "benchmarks" / "results").glob("*.json"))


def test_command_line_writes_paths_under_the_repository_relative_to_it():
    out = REPO / "benchmarks" / "results" / "x.json"
    command = command_line(
        [".venv/bin/python", "-m", "benchmarks.x"], ["--out", str(out), f"--log={REPO}/a.log", "k=v"]
    )
    assert command == ".venv/bin/python -m benchmarks.x --out benchmarks/results/x.json --log=a.log k=v"


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_committed_results_record_a_relative_command(path: Path):
    result = json.loads(path.read_text())
    assert not any(word.startswith("/") for word in result["command"].split()), result["command"]
    assert str(REPO) not in path.read_text()


def test_run_header_names_the_rerun_command_and_the_machine():
    header = record.run_header([".venv/bin/python", "-m", "benchmarks.x"], [f"--out={record.REPO}/r.json"], load=[1.0])
    assert header["command"] == ".venv/bin/python -m benchmarks.x --out=r.json"
    assert header["machine"]["load"] == [1.0] and header["machine"]["cpus"] >= 1
    assert header["date"].endswith("+00:00")
