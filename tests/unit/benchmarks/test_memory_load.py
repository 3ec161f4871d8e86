"""The memory-at-scale benchmark's short variant (benchmarks/memory_load.py): a few actors for a few
seconds against a real memory service with queries batched (memory_service.query_batch=8): every
query answered, and the embedding calls took several queries at once."""

from __future__ import annotations

import json

import pytest

from benchmarks import memory_load

pytestmark = pytest.mark.integration


def test_short_memory_load_answers_every_query_and_batches_them(tmp_path):
    out = tmp_path / "memory_load.json"
    memory_load.main(["--actors", "6", "--seconds", "3", "--batches", "8", "--entries", "200", "--out", str(out)])
    [setting] = json.loads(out.read_text())["settings"]
    assert setting["query_batch"] == 8 and setting["queries_per_s"] > 0, setting
    assert setting["mean_embedding_batch"] > 1.0, setting  # six clients waiting together: one call for several
