"""ScienceWorld's gold path lengths per task, over the variations a learning check plays: the first
`--train` training variations and the first `--test` test variations ("easy" simplification, the
env's own expert path: `load(..., generateGoldPath=True)`, `get_gold_action_sequence()`).

An episode whose step limit is below a variation's gold length cannot solve it, so a learning design's
horizon must admit the longest gold path of the variations it trains and evaluates on
(`benchmarks.learning_check` refuses one that does not, from the same numbers: `horizon_shortfall`).

Run (repository root, ~2 min on 2 cores for all 30 tasks):
  .venv/bin/python -m benchmarks.gold_lengths                      # every task
  .venv/bin/python -m benchmarks.gold_lengths --tasks find-plant   # some
into benchmarks/results/gold_lengths.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.record import REPO, run_header, write_result
from common.scienceworld import ScienceWorld, task_names

RESULTS = REPO / "benchmarks" / "results"


def design_variations(world: ScienceWorld, task: str, train: int, test: int) -> dict[str, list[int]]:
    """The variations a learning design plays: its first `train` training and first `test` test ones."""
    return {"train": world.train_variations(task)[:train], "test": world.test_variations(task)[:test]}


def gold_lengths(world: ScienceWorld, task: str, train: int, test: int) -> dict[str, dict[int, int | None]]:
    """{"train"|"test": {variation: gold length or None}} for `task`."""
    return {
        split: {v: world.gold_length(task, v) for v in variations}
        for split, variations in design_variations(world, task, train, test).items()
    }


def horizon_shortfall(horizon: int, lengths: dict[str, dict[int, int | None]], slack: int = 0) -> list[str]:
    """The variations an episode of `horizon` steps cannot solve with `slack` steps to spare: one line
    each ("test variation 3: gold path 16 actions + slack 2 > 12 steps"); [] when the horizon admits
    all. A variation without a gold path (None) is named too: nothing says it can be solved."""
    short = []
    for split, variations in lengths.items():
        for v, n in sorted(variations.items()):
            if n is None:
                short.append(f"{split} variation {v}: ScienceWorld has no gold path for it")
            elif n + slack > horizon:
                short.append(f"{split} variation {v}: gold path {n} actions + slack {slack} > {horizon} steps")
    return short


def table(result: dict) -> str:
    lines = [
        f'Gold path lengths (actions, "{result["simplification"]}" simplification) over the first '
        f"{result['train']} training and first {result['test']} test variations of each task; "
        f"`{result['command']}`.",
        "",
        "| task | train min-max | test min-max | test median | longest |",
        "|---|---|---|---|---|",
    ]
    for task, splits in result["tasks"].items():
        cells = []
        for split in ("train", "test"):
            found = sorted(n for n in splits[split].values() if n is not None)
            cells.append(f"{found[0]}-{found[-1]}" if found else "-")
        test = sorted(n for n in splits["test"].values() if n is not None)
        every = [n for s in splits.values() for n in s.values() if n is not None]
        median = test[len(test) // 2] if test else "-"
        lines.append(f"| {task} | {cells[0]} | {cells[1]} | {median} | {max(every) if every else '-'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gold_lengths", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="*", default=None, help="default: every ScienceWorld task")
    parser.add_argument("--train", type=int, default=5, help="first N training variations (the paper's 5)")
    parser.add_argument("--test", type=int, default=20, help="first N test variations (the paper's 20)")
    parser.add_argument("--simplification", default="easy")
    parser.add_argument("--out", default=str(RESULTS / "gold_lengths.json"))
    args = parser.parse_args(argv)
    world = ScienceWorld(args.simplification)
    try:
        tasks = {}
        for task in args.tasks or task_names():
            tasks[task] = gold_lengths(world, task, args.train, args.test)
            found = [n for s in tasks[task].values() for n in s.values() if n is not None]
            print(f"[gold_lengths] {task}: {min(found, default=0)}-{max(found, default=0)} actions", flush=True)
    finally:
        world.close()
    result = {
        **run_header([".venv/bin/python", "-m", "benchmarks.gold_lengths"], sys.argv[1:] if argv is None else argv),
        "simplification": args.simplification,
        "train": args.train,
        "test": args.test,
        "tasks": tasks,
    }
    write_result(args.out, result)
    Path(args.out).with_suffix(".md").write_text(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
