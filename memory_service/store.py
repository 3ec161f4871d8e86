"""Memory store: entries keyed by state embeddings, one memory per key, persisted in SQLite (WAL).

Retrieval (docs/method.md): entries whose cosine similarity to the query state exceeds the threshold,
highest stored episode score first (then most similar), top k; the count n feeds the intrinsic
reward 1/(n+1). Each memory keeps its vectors in one contiguous [N, D] array (grown by doubling,
a ring once full), so a query is one matrix-vector product and a vectorised sort.

Every accepted entry is committed to SQLite before add() returns and the store is rebuilt from
the database at start-up, so a restart loses nothing that was accepted. Episode reports waiting
for their reflection are kept in the same database (table `pending_reports`, queue_report) from
before their Ack until their entries are stored (in the same transaction) or they are given up.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Rows of a memory's first vector array; it doubles as the memory fills, up to the capacity.
INITIAL_ROWS = 16


@dataclass
class Entry:
    tip: str  # reflection + the action taken at this step + the episode's final score
    score: float  # the episode's final score: retrieval order
    state: str  # the state text this entry is keyed by (for export and dedup)


@dataclass
class _Memory:
    """FIFO-capped entries of one key. Slots 0..size-1 are used; once full, `head` is the oldest."""

    capacity: int
    vectors: np.ndarray  # float32 [allocated, D], unit rows
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # [allocated]
    entries: list[Entry] = field(default_factory=list)
    row_ids: list[int] = field(default_factory=list)  # SQLite ids, same slots
    seen: set[tuple[str, str]] = field(default_factory=set)  # (tip, state) of stored entries
    size: int = 0
    head: int = 0

    def insert(self, entry: Entry, vector: np.ndarray, row_id: int) -> int | None:
        """Store in the next slot; returns the SQLite id of the entry it evicted, if any."""
        evicted = None
        if self.size < self.capacity:
            slot = self.size
            if slot == len(self.vectors):  # grow by doubling, up to the capacity
                grown = min(max(2 * slot, INITIAL_ROWS), self.capacity)
                self.vectors = np.resize(self.vectors, (grown, self.vectors.shape[1]))
                self.scores = np.resize(self.scores, grown)
            self.entries.append(entry)
            self.row_ids.append(row_id)
            self.size += 1
        else:
            slot = self.head
            old = self.entries[slot]
            self.seen.discard((old.tip, old.state))
            evicted = self.row_ids[slot]
            self.entries[slot], self.row_ids[slot] = entry, row_id
            self.head = (slot + 1) % self.capacity
        self.vectors[slot] = vector
        self.scores[slot] = entry.score
        self.seen.add((entry.tip, entry.state))
        return evicted

    def search(self, query: np.ndarray, threshold: float, top_k: int) -> list[tuple[Entry, float]]:
        similarity = self.vectors[: self.size] @ query
        hits = np.flatnonzero(similarity > threshold)
        # lexsort's last key is the primary one: score descending, then similarity descending
        order = hits[np.lexsort((-similarity[hits], -self.scores[hits]))][:top_k]
        return [(self.entries[i], float(similarity[i])) for i in order]


def _finite(score) -> bool:
    return isinstance(score, (int, float)) and math.isfinite(score)


def memory_key(kind: str, task: str, variation: int) -> str:
    if kind == "task_variation":
        return f"{task}/{variation}"
    if kind == "task":
        return task
    if kind == "global":
        return "*"
    raise ValueError(f"memory_service.key must be task_variation|task|global, got {kind!r}")


class MemoryStore:
    def __init__(self, db_path: str | Path, capacity: int):  # capacity: memory_service.capacity
        self.capacity = capacity
        self.memories: dict[str, _Memory] = {}
        self.lock = threading.Lock()
        self.db = sqlite3.connect(str(db_path), check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS entries (id INTEGER PRIMARY KEY, key TEXT, tip TEXT, score REAL, state TEXT, vector BLOB)"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS pending_reports (id INTEGER PRIMARY KEY, episode_id TEXT UNIQUE, "
            "record BLOB, attempts INTEGER DEFAULT 0)"
        )
        evicted = []  # rows over a capacity lowered since the last run, and unusable rows
        self.unusable_rows = 0
        for row_id, key, tip, score, state, blob in self.db.execute("SELECT * FROM entries ORDER BY id").fetchall():
            # SQLite stores a NaN score as NULL: such a row (written before scores were checked) would
            # break every MemoryResult that retrieves it, so it is dropped, as is any other bad row
            if not (_finite(score) and isinstance(tip, str) and isinstance(state, str) and isinstance(blob, bytes)):
                evicted.append(row_id)
                self.unusable_rows += 1
                continue
            evicted.append(self._insert(key, row_id, Entry(tip, score, state), np.frombuffer(blob, np.float32)))
        with self.db:
            self.db.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in evicted if i is not None])

    def add(self, key: str, entries: list[Entry], vectors: np.ndarray, done_report: int | None = None) -> int:
        """Store entries (vectors [N, D] unit norm); returns how many were new. `done_report`: the
        pending report (queue_report's id) these entries come from, removed in the same transaction."""
        added = 0
        with self.lock, self.db:
            if done_report is not None:
                self.db.execute("DELETE FROM pending_reports WHERE id = ?", (done_report,))
            for entry, vector in zip(entries, vectors):
                if not _finite(entry.score):  # EpisodeReport.validate refuses these; never store one
                    continue
                memory = self.memories.get(key)
                if memory is not None and (entry.tip, entry.state) in memory.seen:
                    continue
                vector = np.ascontiguousarray(vector, dtype=np.float32)
                cur = self.db.execute(
                    "INSERT INTO entries (key, tip, score, state, vector) VALUES (?, ?, ?, ?, ?)",
                    (key, entry.tip, entry.score, entry.state, vector.tobytes()),
                )
                evicted = self._insert(key, cur.lastrowid, entry, vector)
                if evicted is not None:
                    self.db.execute("DELETE FROM entries WHERE id = ?", (evicted,))
                added += 1
        return added

    def _insert(self, key: str, row_id: int, entry: Entry, vector: np.ndarray) -> int | None:
        memory = self.memories.get(key)
        if memory is None:
            memory = self.memories[key] = _Memory(self.capacity, np.zeros((0, vector.size), np.float32))
        return memory.insert(entry, vector, row_id)

    def retrieve(self, key: str, query: np.ndarray, threshold: float, top_k: int) -> list[tuple[Entry, float]]:
        """(entry, similarity) with similarity > threshold, highest episode score first, top k."""
        with self.lock:
            memory = self.memories.get(key)
            if memory is None or memory.size == 0:
                return []
            return memory.search(query.astype(np.float32), threshold, top_k)

    # ------------------------------------------------------------------ the reflection queue
    def queue_report(self, episode_id: str, record: bytes) -> int | None:
        """Persist an episode report (its encoded record) until it is reflected on; committed when
        this returns. Its id, or None if a report of that episode is already queued."""
        with self.lock, self.db:
            cur = self.db.execute(
                "INSERT OR IGNORE INTO pending_reports (episode_id, record) VALUES (?, ?)", (episode_id, record)
            )
            return cur.lastrowid if cur.rowcount else None

    def pending_reports(self) -> list[tuple[int, bytes]]:
        """(id, record) of every queued report, oldest first: what a restarted service resumes."""
        with self.lock:
            return self.db.execute("SELECT id, record FROM pending_reports ORDER BY id").fetchall()

    def report_failed(self, report_id: int, max_attempts: int) -> bool:
        """Count a failed reflection; True if the report stays queued, False if it has now had
        `max_attempts` and is given up (removed)."""
        with self.lock, self.db:
            self.db.execute("UPDATE pending_reports SET attempts = attempts + 1 WHERE id = ?", (report_id,))
            (attempts,) = self.db.execute("SELECT attempts FROM pending_reports WHERE id = ?", (report_id,)).fetchone()
            if attempts < max_attempts:
                return True
            self.db.execute("DELETE FROM pending_reports WHERE id = ?", (report_id,))
            return False

    def export_rows(self):
        """(key, Entry, vector) of every stored entry, oldest first (the SQLite rows)."""
        with self.lock:
            rows = self.db.execute("SELECT key, tip, score, state, vector FROM entries ORDER BY id").fetchall()
        for key, tip, score, state, blob in rows:
            yield key, Entry(tip, score, state), np.frombuffer(blob, np.float32)

    def size(self, key: str) -> int:
        with self.lock:
            memory = self.memories.get(key)
            return memory.size if memory else 0

    def stats(self) -> tuple[int, int]:
        with self.lock:
            return len(self.memories), sum(m.size for m in self.memories.values())

    def close(self) -> None:
        self.db.close()
