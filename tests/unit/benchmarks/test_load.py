"""The load benchmark's short variant (benchmarks/load.py): 8 synthetic actors for a few seconds
per durability level against a real replay buffer and memory service. Every acknowledged episode
id is in the buffer's log exactly once at every level, and traffic flowed on both sockets."""

from __future__ import annotations

import json

import pytest

from benchmarks import load

pytestmark = pytest.mark.integration


def test_short_load_run_keeps_every_acknowledged_trajectory_exactly_once(tmp_path):
    out = tmp_path / "load.json"
    load.main(["--actors", "8", "--seconds", "3", "--prompt-tokens", "64", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [r["durability"] for r in result["levels"]] == ["flush", "fsync", "group"]
    for r in result["levels"]:
        assert r["trajectories_acked"] > 0 and r["memory_queries_per_s"] > 0, r
        assert r["audit"]["ok"] and r["audit"]["missing"] == 0 and r["audit"]["more_than_once"] == 0, r
        assert r["batches_confirmed"] > 0, r  # the learner thread took and confirmed batches
    group = result["levels"][2]
    assert 0 < group["group_commits"] <= group["trajectories_acked"] + group["batches_confirmed"]  # commits group Acks
