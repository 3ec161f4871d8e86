"""The memory-at-scale benchmark's short variant (benchmarks/memory_load.py): a few actors for a few
seconds against a real memory service with queries batched (memory_service.query_batch=8), without
and with the embedding cache (and the cheaper forward: 128 word pieces, bf16 where native): every
query answered, the embedding calls took several queries at once, and with the cache the repeated
states were answered from it."""

from __future__ import annotations

import json

import pytest

from benchmarks import memory_load

pytestmark = pytest.mark.integration


def test_short_memory_load_answers_every_query_and_batches_them(tmp_path):
    out = tmp_path / "memory_load.json"
    settings = ["--settings", "8:0", "8:64:128:auto"]
    args = ["--actors", "6", "--seconds", "3", *settings, "--entries", "200", "--repeat", "0.5"]
    memory_load.main([*args, "--out", str(out)])
    uncached, cached = json.loads(out.read_text())["settings"]
    for setting in (uncached, cached):
        assert setting["query_batch"] == 8 and setting["queries_per_s"] > 0, setting
        assert setting["mean_embedding_batch"] > 1.0, setting  # six clients waiting together: one call for several
    assert (cached["embedding_max_tokens"], cached["embedding_dtype"]) == (128, "auto")
    assert (uncached["embedding_max_tokens"], uncached["embedding_dtype"]) == (0, "float32")  # the forward before
    assert uncached["answers"] == {"pairs_decided_as_first": 1.0, "min_cosine_to_first": 1.0}
    assert cached["answers"]["pairs_decided_as_first"] > 0.8 and cached["answers"]["min_cosine_to_first"] > 0.5
    # embedding_cache=0: only a state asked twice in one batch is embedded once; with the cache, half the
    # queries repeat a recent state of their group
    assert uncached["cache_hit_rate"] < 0.2 < cached["cache_hit_rate"], (uncached, cached)


def test_a_group_repeats_its_own_recent_states_at_the_given_rate():
    real = ["look text a", "look text b"]
    stream = memory_load.StateStream(0, 0.42, real)
    texts = [stream.next() for _ in range(2000)]
    repeats = sum(t in set(texts[:i]) for i, t in enumerate(texts))
    assert 0.38 < repeats / len(texts) < 0.46
    assert memory_load.StateStream(0, 0.42, real).next() == texts[0]  # seeded per group
    assert len(memory_load.observations()) > 50  # the committed real episodes' distinct observations
