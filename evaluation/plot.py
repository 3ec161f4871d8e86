"""`empo2-plot RUN_DIR [RUN_DIR ...] [--out DIR]`: a run read from pictures (matplotlib PNGs).

Reads each run's <run_dir>/metrics.jsonl (learner "step" records, learner/train.py; "eval"
records, evaluation/eval.py) and writes, to --out (default <first run>/plots):
  score.png           training episode score vs learner step and vs wall time, runs overlaid
                      (the paper's Figure 13)
  eval.png            evaluation score and success rate vs learner step, runs overlaid
  training.png        loss, clip fraction and masked fraction vs step
  time_breakdown.png  per run, stacked seconds per step: the learner's phases (batch wait, score,
                      forward/backward, optimizer, push, ...) and the actors' rollout phases
                      (generation, env step, memory retrieval, ...) (the paper's Figure 12)
A figure without data in any run (eval.png before any evaluation) is not written; the command
says which it wrote.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.metrics import METRICS_LOG


def read_log(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(step records, eval records) of a run, in file order; cut or foreign lines are skipped."""
    steps, evals = [], []
    path = run_dir / METRICS_LOG
    if not path.exists():
        raise FileNotFoundError(f"{path}: no metrics log (the learner writes it, one line per step)")
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = record.get("record", "step") if isinstance(record, dict) else None
        (steps if kind == "step" else evals if kind == "eval" else []).append(record)
    return steps, evals


def _series(records: list[dict], x: str, y: str) -> tuple[list[float], list[float]]:
    points = [(r[x], r[y]) for r in records if r.get(x) is not None and r.get(y) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_runs(run_dirs: list[Path], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    runs = [(d.resolve().name, *read_log(d)) for d in run_dirs]
    written: list[Path] = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    # the paper's Figure 13: score vs step and vs wall time
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for name, steps, _ in runs:
        by_step.plot(*_series(steps, "step", "episode_score_mean"), marker=".", label=name)
        timed = [r for r in steps if "wall_time" in r and "elapsed_s" in r]
        if timed:  # minutes since the run began: a restarted learner's elapsed_s starts again from 0
            start = timed[0]["wall_time"] - timed[0]["elapsed_s"]
            minutes = [(r["wall_time"] - start) / 60 for r in timed]
            by_time.plot(minutes, [r["episode_score_mean"] for r in timed], marker=".", label=name)
    by_step.set(xlabel="learner step", ylabel="mean episode score (training batch)", title="score vs step")
    by_time.set(xlabel="wall time (min)", ylabel="mean episode score (training batch)", title="score vs wall time")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, "score.png")

    if any(evals for _, _, evals in runs):
        fig, (score, success) = plt.subplots(1, 2, figsize=(11, 4))
        for name, _, evals in runs:
            # one series per evaluation size: the periodic subset and a final evaluation of the same
            # checkpoint are different measurements
            sizes = dict.fromkeys((r.get("variations_per_task"), r.get("episodes_per_variation")) for r in evals)
            for size in sizes:
                same = [r for r in evals if (r.get("variations_per_task"), r.get("episodes_per_variation")) == size]
                label = f"{name} ({size[0]} x {size[1]})" if size[0] else name
                score.plot(*_series(same, "step", "mean_score"), marker="o", label=label)
                xs, ys = _series(same, "step", "mean_success_rate")
                success.plot(xs, [100 * y for y in ys], marker="o", label=label)
        score.set(xlabel="learner step (checkpoint)", ylabel="test score (mean over tasks)", title="evaluation score")
        success.set(xlabel="learner step (checkpoint)", ylabel="success rate (%)", title="evaluation success")
        for ax in (score, success):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        save(fig, "eval.png")

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, label in zip(
        axes,
        ("loss", "clip_fraction", "masked_fraction"),
        ("policy loss", "clipped token fraction", "masked sample fraction"),
    ):
        for name, steps, _ in runs:
            ax.plot(*_series(steps, "step", key), marker=".", label=name)
        ax.set(xlabel="learner step", title=label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, "training.png")

    # the paper's Figure 12: where the time goes, per component
    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 3.5 * len(runs)), squeeze=False)
    for (name, steps, _), (learner_ax, actor_ax) in zip(runs, axes):
        for ax, key, title in (
            (learner_ax, "phase_seconds", f"{name}: learner seconds per step, by phase"),
            (actor_ax, "rollout_phase_seconds", f"{name}: actor-seconds of each batch's episodes, by phase"),
        ):
            phases = list(dict.fromkeys(p for r in steps for p in r.get(key, {})))
            xs = [r["step"] for r in steps]
            bottom = [0.0] * len(steps)
            for phase in phases:
                heights = [r.get(key, {}).get(phase, 0.0) for r in steps]
                ax.bar(xs, heights, bottom=bottom, label=phase)
                bottom = [b + h for b, h in zip(bottom, heights)]
            ax.set(xlabel="learner step", ylabel="seconds", title=title)
            ax.set_ylim(0, 1.1 * max(bottom, default=0.0) or 1.0)  # the whole stack of the tallest step
            if phases:
                ax.legend(fontsize=7, framealpha=0.6)
    save(fig, "time_breakdown.png")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="empo2-plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories holding metrics.jsonl")
    parser.add_argument("--out", type=Path, default=None, help="where the PNGs go (default <first run>/plots)")
    args = parser.parse_args(argv)
    try:
        written = plot_runs(args.run_dirs, args.out or args.run_dirs[0] / "plots")
    except FileNotFoundError as exc:
        print(f"empo2-plot: {exc}", file=sys.stderr)
        return 2
    print("\n".join(f"[plot] wrote {path}" for path in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
