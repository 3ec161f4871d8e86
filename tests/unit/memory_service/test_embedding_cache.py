"""memory_service.embedding_cache (issue 26, item 6): a repeated state is answered with the vector a
lone, uncached embedding gives it; texts repeated in one call are embedded once; the least recently
used text leaves first; the service counts hits and misses. The real embedded MiniLM."""

from __future__ import annotations

import numpy as np
import pytest

from memory_service.config import EMBEDDED_EMBEDDER
from memory_service.embedder import Embedder

STATES = [f"This room is called the kitchen. In it, you see: a fridge, a sink and item {i}." for i in range(4)]


@pytest.fixture(scope="module")
def uncached():
    return Embedder(EMBEDDED_EMBEDDER)


def test_cached_answers_are_the_lone_uncached_vectors(uncached):
    counts: list[tuple[int, int]] = []
    cached = Embedder(EMBEDDED_EMBEDDER, cache_texts=8, counted=lambda e, c: counts.append((e, c)))
    first = cached.embed([STATES[0], STATES[1], STATES[0]])  # a repeat within one call: embedded once
    again = cached.embed([STATES[1], STATES[0]])
    assert counts == [(2, 1), (0, 2)]
    alone = np.stack([uncached.embed([s])[0] for s in STATES[:2]])
    np.testing.assert_allclose(first, alone[[0, 1, 0]], atol=1e-6)
    np.testing.assert_array_equal(again, first[[1, 0]])  # the vector it had, bit for bit
    assert not uncached.cache  # cache_texts=0 keeps nothing


def test_the_least_recently_used_text_leaves_first():
    counts: list[tuple[int, int]] = []
    cached = Embedder(EMBEDDED_EMBEDDER, cache_texts=2, counted=lambda e, c: counts.append((e, c)))
    cached.embed(STATES[:2])
    cached.embed([STATES[0]])  # 0 is now the most recent
    cached.embed([STATES[2]])  # evicts 1
    assert list(cached.cache) == [STATES[0], STATES[2]]
    cached.embed([STATES[1], STATES[0]])
    assert counts[-1] == (1, 1)  # 1 had left, 0 had stayed
    assert cached.embed([]).shape == (0, 384)
