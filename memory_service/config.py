"""Configuration of the memory service."""

from __future__ import annotations

from dataclasses import dataclass

EMBEDDED_EMBEDDER = "embedded:all-MiniLM-L6-v2"


@dataclass
class MemoryServiceConfig:
    embedder: str = EMBEDDED_EMBEDDER  # any sentence-transformers model dir/name, or the embedded one
    similarity_threshold: float = 0.5  # cosine similarity a memory must exceed to be retrieved
    top_k: int = 10  # memories returned per query, highest episode score first
    capacity: int = 1000  # FIFO cap per memory
    key: str = "task_variation"  # one memory per "task_variation" | "task" | "global"
    reflection_max_tokens: int = 128
    reflection_temperature: float = 0.7
    reflection_timeout_s: float = 300.0
    db_file: str = "memory.sqlite"  # inside run_dir; every accepted entry is persisted here
