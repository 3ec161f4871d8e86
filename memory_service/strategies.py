"""SGE's strategy store (conf/preset/sge.yaml): each episode's opening strategy with the score its episode
reached, and the reflection each group is shown (StrategyQuery), kept per group so that every member
sees the same one, across a restart too. In the memory service's SQLite database, its own tables;
each write is committed before the answer that depends on it."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

# Reflections kept for their groups: a group's members ask within minutes of each other; the oldest
# beyond this are deleted (a member asking after that gets a reflection computed afresh).
MAX_GROUP_REFLECTIONS = 4096


class StrategyStore:
    def __init__(
        self, db_path: str | Path, capacity: int
    ):  # capacity: strategies kept per task (memory_service.capacity)
        self.capacity = capacity
        self.lock = threading.Lock()
        self.db = sqlite3.connect(str(db_path), check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS strategies (id INTEGER PRIMARY KEY, episode_id TEXT UNIQUE, task TEXT, "
            "variation INTEGER, strategy TEXT, score REAL, temperature REAL)"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS group_reflections (id INTEGER PRIMARY KEY, group_id TEXT UNIQUE, shown TEXT)"
        )
        self.db.commit()

    def add(self, episode_id: str, task: str, variation: int, strategy: str, score: float, temperature: float) -> bool:
        """Keep an episode's strategy (once per episode: a re-sent report adds nothing); the task's
        oldest beyond the capacity go. True if it was new."""
        with self.lock, self.db:
            cursor = self.db.execute(
                "INSERT OR IGNORE INTO strategies (episode_id, task, variation, strategy, score, temperature) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (episode_id, task, variation, strategy, score, temperature),
            )
            self.db.execute(
                "DELETE FROM strategies WHERE task = ? AND id NOT IN "
                "(SELECT id FROM strategies WHERE task = ? ORDER BY id DESC LIMIT ?)",
                (task, task, self.capacity),
            )
            return cursor.rowcount > 0

    def reflection(self, group_id: str, task: str, best: int, recent: int) -> list[tuple[str, float]]:
        """The (strategy, score) pairs group `group_id` is shown: the first time, the task's `best`
        best-scoring distinct strategies (the newer first among equal scores) and then its `recent`
        most recent others; every later time, the same."""
        with self.lock, self.db:
            row = self.db.execute("SELECT shown FROM group_reflections WHERE group_id = ?", (group_id,)).fetchone()
            if row is not None:
                return [(s, float(v)) for s, v in json.loads(row[0])]
            rows = self.db.execute(
                "SELECT strategy, score FROM strategies WHERE task = ? ORDER BY id DESC", (task,)
            ).fetchall()  # newest first
            top: dict[str, float] = {}  # each distinct strategy at its best score
            for strategy, score in rows:
                top[strategy] = max(score, top.get(strategy, score))
            ranked = sorted(top, key=lambda s: -top[s])[:best]  # stable: the newer first among equal scores
            newest = list(dict.fromkeys(s for s, _ in rows if s not in ranked))[:recent]
            shown = [(s, top[s]) for s in ranked + newest]
            self.db.execute(
                "INSERT INTO group_reflections (group_id, shown) VALUES (?, ?)", (group_id, json.dumps(shown))
            )
            self.db.execute(
                "DELETE FROM group_reflections WHERE id <= (SELECT MAX(id) FROM group_reflections) - ?",
                (MAX_GROUP_REFLECTIONS,),
            )
            return shown

    def count(self) -> int:
        with self.lock:
            return self.db.execute("SELECT COUNT(*) FROM strategies").fetchone()[0]

    def close(self) -> None:
        self.db.close()
