"""`empo2-memory`: export and import a memory store (the SQLite file of a run).

    empo2-memory export runs/default/memory.sqlite memories.jsonl
    empo2-memory import memories.jsonl other_run/memory.sqlite [--capacity 1000]

One JSON object per line: key, tip, score, state and the embedding (base64 float32). Import
goes through the store's own add(), so duplicates are dropped and the FIFO cap holds. Import
into the file of a stopped memory service (a running one reads its file only at start-up).
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import sys

import numpy as np

from memory_service.config import MemoryServiceConfig
from memory_service.store import Entry, MemoryStore


def export_store(db: str, out_path: str) -> int:
    store = MemoryStore(db, capacity=sys.maxsize)  # never evict while reading
    count = 0
    with open(out_path, "w") as out:
        for key, entry, vector in store.export_rows():
            record = {
                "key": key,
                "tip": entry.tip,
                "score": entry.score,
                "state": entry.state,
                "vector": base64.b64encode(vector.astype(np.float32).tobytes()).decode(),
            }
            out.write(json.dumps(record) + "\n")
            count += 1
    store.close()
    return count


def import_store(in_path: str, db: str, capacity: int) -> int:
    store = MemoryStore(db, capacity)
    with open(in_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    added = 0
    for key, group in itertools.groupby(records, key=lambda r: r["key"]):
        group = list(group)
        vectors = np.stack([np.frombuffer(base64.b64decode(r["vector"]), np.float32) for r in group])
        added += store.add(key, [Entry(r["tip"], float(r["score"]), r["state"]) for r in group], vectors)
    store.close()
    return added


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="empo2-memory", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="store -> JSONL")
    exp.add_argument("db")
    exp.add_argument("out")
    imp = sub.add_parser("import", help="JSONL -> store (dedup, FIFO cap)")
    imp.add_argument("jsonl")
    imp.add_argument("db")
    imp.add_argument(
        "--capacity",
        type=int,
        default=MemoryServiceConfig.capacity,
        help="FIFO cap per memory (default: memory_service.capacity's)",
    )
    args = parser.parse_args(argv)
    if args.command == "export":
        print(f"exported {export_store(args.db, args.out)} entries to {args.out}")
    else:
        print(f"imported {import_store(args.jsonl, args.db, args.capacity)} new entries into {args.db}")


if __name__ == "__main__":
    main()
