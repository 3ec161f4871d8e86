"""Memory store: entries keyed by state embeddings, one memory per key, persisted in SQLite (WAL).

Retrieval (empo2.md): entries whose cosine similarity to the query state exceeds the threshold,
highest stored episode score first, top k; the count n feeds the intrinsic reward 1/(n+1).
Every accepted entry is committed to SQLite before add() returns, and the store is rebuilt from
the database at start-up, so a restart loses nothing that was accepted.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Entry:
    tip: str  # reflection + the action taken at this step + the episode's final score
    score: float  # the episode's final score: retrieval order
    state: str  # the state text this entry is keyed by (for export and dedup)


@dataclass
class _Memory:
    entries: list[Entry] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # SQLite row ids, same order
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))  # [N, D], unit norm
    seen: set[tuple[str, str]] = field(default_factory=set)  # (tip, state): exact duplicates


def memory_key(kind: str, task: str, variation: int) -> str:
    if kind == "task_variation":
        return f"{task}/{variation}"
    if kind == "task":
        return task
    if kind == "global":
        return "*"
    raise ValueError(f"memory_service.key must be task_variation|task|global, got {kind!r}")


class MemoryStore:
    def __init__(self, db_path: str | Path, capacity: int = 1000):
        self.capacity = capacity
        self.memories: dict[str, _Memory] = {}
        self.lock = threading.Lock()
        self.db = sqlite3.connect(str(db_path), check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS entries (id INTEGER PRIMARY KEY, key TEXT, tip TEXT, score REAL, state TEXT, vector BLOB)"
        )
        evicted = []  # rows over a capacity lowered since the last run
        for row_id, key, tip, score, state, blob in self.db.execute("SELECT * FROM entries ORDER BY id").fetchall():
            evicted += self._insert(key, row_id, Entry(tip, score, state), np.frombuffer(blob, np.float32))
        with self.db:
            self.db.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in evicted])

    def add(self, key: str, entries: list[Entry], vectors: np.ndarray) -> int:
        """Store entries (vectors [N, D] unit norm); returns how many were new."""
        added = 0
        with self.lock, self.db:
            for entry, vector in zip(entries, vectors):
                memory = self.memories.get(key)
                if memory is not None and (entry.tip, entry.state) in memory.seen:
                    continue
                vector = np.ascontiguousarray(vector, dtype=np.float32)
                cur = self.db.execute(
                    "INSERT INTO entries (key, tip, score, state, vector) VALUES (?, ?, ?, ?, ?)",
                    (key, entry.tip, entry.score, entry.state, vector.tobytes()),
                )
                evicted = self._insert(key, cur.lastrowid, entry, vector)
                if evicted:
                    self.db.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in evicted])
                added += 1
        return added

    def _insert(self, key: str, row_id: int, entry: Entry, vector: np.ndarray) -> list[int]:
        memory = self.memories.setdefault(key, _Memory(vectors=np.zeros((0, vector.size), np.float32)))
        memory.entries.append(entry)
        memory.ids.append(row_id)
        memory.seen.add((entry.tip, entry.state))
        memory.vectors = np.vstack([memory.vectors, vector[None, :]])
        evicted = []
        while len(memory.entries) > self.capacity:  # FIFO: the oldest entry goes first
            old = memory.entries.pop(0)
            memory.seen.discard((old.tip, old.state))
            evicted.append(memory.ids.pop(0))
            memory.vectors = memory.vectors[1:]
        return evicted

    def retrieve(self, key: str, query: np.ndarray, threshold: float, top_k: int) -> list[tuple[Entry, float]]:
        """(entry, similarity) with similarity > threshold, highest episode score first, top k."""
        with self.lock:
            memory = self.memories.get(key)
            if memory is None or not memory.entries:
                return []
            similarity = memory.vectors @ query.astype(np.float32)
            hits = np.flatnonzero(similarity > threshold)
            # score descending, then similarity descending for equal scores
            order = sorted(hits.tolist(), key=lambda i: (-memory.entries[i].score, -similarity[i]))
            return [(memory.entries[i], float(similarity[i])) for i in order[:top_k]]

    def stats(self) -> tuple[int, int]:
        with self.lock:
            return len(self.memories), sum(len(m.entries) for m in self.memories.values())

    def close(self) -> None:
        self.db.close()
