"""memory_service.embedding_cache (issue 26, item 6): a repeated state is answered with the vector a
lone, uncached embedding gives it; texts repeated in one call are embedded once; the least recently
used text leaves first; the service counts hits and misses. The real embedded MiniLM."""

from __future__ import annotations

import numpy as np
import pytest

from memory_service.config import EMBEDDED_EMBEDDER
from memory_service.embedder import Embedder, native_bf16, uses_bf16

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


def test_only_the_first_max_tokens_word_pieces_are_embedded(uncached):
    """memory_service.embedding_max_tokens: two states that differ only after their first word pieces
    get one vector when cut there, two without the cut."""
    head = "This room is called the kitchen. In it, you see: a fridge, a sink, a counter, a stove, a table."
    states = [head + " On the table is: a red apple.", head + " A door to the hallway (that is open)."]
    cut = Embedder(EMBEDDED_EMBEDDER, max_tokens=16).embed(states)
    np.testing.assert_allclose(cut[0], cut[1], atol=1e-6)
    whole = uncached.embed(states)
    assert float(whole[0] @ whole[1]) < 0.99


def test_bfloat16_vectors_are_float32_s_within_a_cosine_of_1e_4(uncached):
    """memory_service.embedding_dtype=bfloat16 (autocast): the same neighbours as float32; `auto` takes
    it only on CPUs with native bf16 instructions."""
    states = [*STATES, "A door to the hallway (that is open). You also see: a bathroom with a sink."]
    bf16 = Embedder(EMBEDDED_EMBEDDER, bf16=True)
    assert bf16.bf16 and not uncached.bf16
    low, full = bf16.embed(states), uncached.embed(states)
    assert low.dtype == np.float32
    assert np.min(np.sum(low * full, axis=1)) > 0.9999
    np.testing.assert_array_equal(np.argsort(-(low @ low.T), axis=1), np.argsort(-(full @ full.T), axis=1))
    assert uses_bf16("auto") == native_bf16() and not uses_bf16("float32")
