"""How well the memory's state key tells real ScienceWorld states apart (issue 37, item 2).

States are collected by playing the env itself: each variation's gold path, then random walks whose
actions favour moving and carrying (open a door, go to a room, pick up, put down: the actions that
change the situation) over the rest of the valid actions. Each state is labelled by its situation
(the room and the inventory). For each state key of the memory service (memory_service.state_key:
`observation`, the paper's, and `situation`), every pair of states of one task is embedded with the
service's own Embedder and its cosine split by whether the two states share a situation. The table
gives the quantiles of each, and per threshold the share of pairs of different situations that would
pass it (tips from elsewhere) and of the same situation (tips from here).

Run (repository root, ~3 min on 2 cores):
  .venv/bin/python -m benchmarks.state_keys
into benchmarks/results/state_keys.{json,md}.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np

from benchmarks.record import REPO, run_header, write_result
from common.scienceworld import ScienceWorld, room_of
from memory_service.config import EMBEDDED_EMBEDDER, MemoryServiceConfig, StateKey
from memory_service.embedder import Embedder
from memory_service.state_key import key_text

RESULTS = REPO / "benchmarks" / "results"
TASKS = ["find-living-thing", "find-animal", "find-plant", "find-non-living-thing"]
THRESHOLDS = [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98]
QUANTILES = [0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99]
MOVES = ("open door", "go to", "pick up", "put down", "move")


def collect(world: ScienceWorld, task: str, variations: int, walks: int, steps: int, rng: random.Random) -> list:
    """(state, inventory) of every step of the gold paths and random walks of the first training variations."""
    states = []
    for variation in world.train_variations(task)[:variations]:
        gold = world.demonstration(task, variation)[1]
        for walk in range(walks + 1):  # walk 0: the gold path
            result = world.reset(task, variation)
            inventory = result.inventory
            for t in range(steps if walk else len(gold)):
                states.append((result.state, inventory))
                if walk:
                    moves = [a for a in result.valid_actions if a.startswith(MOVES)]
                    action = rng.choice(moves if moves and rng.random() < 0.7 else result.valid_actions)
                else:
                    action = gold[t]
                result = world.step(action)
                inventory = result.inventory
                if result.done:
                    break
    return states


def situation(state: str, inventory: str) -> tuple[str, str]:
    return room_of(state), " ".join(inventory.split())


def pair_cosines(vectors: np.ndarray, labels: list) -> tuple[np.ndarray, np.ndarray]:
    """Cosines of every pair of distinct states (i < j), split into (same situation, different)."""
    sims = vectors @ vectors.T
    i, j = np.triu_indices(len(labels), k=1)
    same = np.array([labels[a] == labels[b] for a, b in zip(i, j)])
    return sims[i, j][same], sims[i, j][~same]


def summary(values: np.ndarray) -> dict:
    return {f"q{int(q * 100):02d}": round(float(np.quantile(values, q)), 3) for q in QUANTILES} if len(values) else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="state_keys", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="*", default=TASKS)
    parser.add_argument("--variations", type=int, default=5, help="first N training variations (the paper's 5)")
    parser.add_argument("--walks", type=int, default=3, help="random walks per variation")
    parser.add_argument("--steps", type=int, default=16, help="steps per random walk")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "state_keys.json"))
    args = parser.parse_args(argv)
    cfg = MemoryServiceConfig()
    embedder = Embedder(EMBEDDED_EMBEDDER, 0, max_tokens=cfg.embedding_max_tokens)
    world, rng = ScienceWorld("easy"), random.Random(args.seed)
    tasks = {}
    try:
        for task in args.tasks:
            states = collect(world, task, args.variations, args.walks, args.steps, rng)
            labels = [situation(s, inv) for s, inv in states]
            per_key = {}
            for kind in StateKey:
                vectors = embedder.embed([key_text(kind, s, inv) for s, inv in states])
                same, different = pair_cosines(vectors, labels)
                per_key[kind.value] = {
                    "same_situation": summary(same),
                    "different_situation": summary(different),
                    # per threshold: the share of pairs above it
                    "pass_different": {str(t): round(float((different > t).mean()), 4) for t in THRESHOLDS},
                    "pass_same": {str(t): round(float((same > t).mean()), 4) for t in THRESHOLDS} if len(same) else {},
                }
            tasks[task] = {"states": len(states), "situations": len(set(labels)), "keys": per_key}
            print(f"[state_keys] {task}: {len(states)} states, {len(set(labels))} situations", flush=True)
    finally:
        world.close()
    result = {
        **run_header([".venv/bin/python", "-m", "benchmarks.state_keys"], sys.argv[1:] if argv is None else argv),
        "embedder": EMBEDDED_EMBEDDER,
        "embedding_max_tokens": cfg.embedding_max_tokens,
        "design": {"variations": args.variations, "walks": args.walks, "steps": args.steps, "seed": args.seed},
        "tasks": tasks,
    }
    write_result(args.out, result)
    Path(args.out).with_suffix(".md").write_text(table(result))
    return 0


def table(result: dict) -> str:
    lines = [
        f"MiniLM cosine between real states of one task (`{result['command']}`): pairs of the same situation "
        "(room and inventory) and of different ones, per state key; then per threshold the share of pairs of "
        "*different* situations above it (a tip from elsewhere retrieved) / of the *same* situation.",
        "",
        "| task | key | states (situations) | same: q05 / median | different: q50 / q95 / q99 | "
        + " | ".join(f"> {t}" for t in THRESHOLDS)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(THRESHOLDS),
    ]
    for task, t in result["tasks"].items():
        for kind, k in t["keys"].items():
            same, diff = k["same_situation"], k["different_situation"]
            cells = [
                f"{k['pass_different'][str(x)]:.0%} / {k['pass_same'].get(str(x), float('nan')):.0%}"
                for x in THRESHOLDS
            ]
            lines.append(
                f"| {task} | {kind} | {t['states']} ({t['situations']}) | {same.get('q05', '-')} / "
                f"{same.get('q50', '-')} | {diff['q50']} / {diff['q95']} / {diff['q99']} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
