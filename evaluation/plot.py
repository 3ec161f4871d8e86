"""`empo2-plot RUN_DIR [RUN_DIR ...] [--out DIR]`: a run read from pictures (matplotlib PNGs).

Reads each run's <run_dir>/metrics.jsonl (learner "step" records, learner/train.py; "eval"
records, evaluation/eval.py) and writes, to --out (default <first run>/plots):
  score.png           training episode score vs learner step and vs wall time, runs overlaid
                      (the paper's Figure 13): each batch's mean as a dot, their moving average
                      over SMOOTHING steps as a line in a band of ± the window's standard
                      deviation (one noisy batch is not a collapse), and vs step the evaluations
                      with their 95% intervals where the records carry them
  eval.png            evaluation score and success rate vs learner step, runs overlaid, with
                      their intervals (an eval record's "<field>_ci": [low, high]) where present
  training.png        loss, clip fraction and masked fraction vs step
  exploration.png     distinct states per episode and per group, distinct actions per group, the
                      fraction of collapsed groups (learner/exploration.py) and the policy's
                      entropy, vs step: written when the records carry them
  memory.png          EMPO2's memory at work (learner/memory_use.py): turns that showed tips, tip turns
                      trained, retrievals that hit, memories per retrieval, r_int's spread in a group:
                      written when the records carry them
  curves.png          with --arm NAME=DIR,DIR,... (repeated): per arm, its seeds' training success and
                      score vs step, the mean in a band of the min and max over seeds
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
from learner.exploration import METRICS as EXPLORATION

SMOOTHING = 5  # steps in the training score's moving average (score.png)


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


def moving_band(values: list[float], window: int = SMOOTHING) -> tuple[list[float], list[float], list[float]]:
    """(mean, mean - std, mean + std) over the trailing `window` values at each point (fewer at the
    start): the smoothed curve and its band, std the window's population standard deviation."""
    means, lows, highs = [], [], []
    for i in range(len(values)):
        part = values[max(0, i - window + 1) : i + 1]
        mean = sum(part) / len(part)
        std = (sum((v - mean) ** 2 for v in part) / len(part)) ** 0.5
        means.append(mean)
        lows.append(mean - std)
        highs.append(mean + std)
    return means, lows, highs


def _smoothed(ax, xs: list[float], ys: list[float], label: str, color: str) -> None:
    """Each point faint, their moving average as a line in its band (moving_band)."""
    ax.plot(xs, ys, ".", color=color, alpha=0.35)
    mean, low, high = moving_band(ys)
    ax.plot(xs, mean, color=color, label=f"{label} (mean of {SMOOTHING})")
    ax.fill_between(xs, low, high, color=color, alpha=0.15)


def _with_intervals(ax, records: list[dict], y: str, label: str, scale: float = 1.0, **style) -> None:
    """`y` vs step; error bars where a record carries its interval ("<y>_ci": [low, high])."""
    records = [r for r in records if r.get("step") is not None and r.get(y) is not None]
    xs, ys = [r["step"] for r in records], [scale * r[y] for r in records]
    bounds = [r.get(f"{y}_ci") or [r[y], r[y]] for r in records]
    below = [y_ - scale * lo for y_, (lo, _) in zip(ys, bounds)]
    above = [scale * hi - y_ for y_, (_, hi) in zip(ys, bounds)]
    yerr = [below, above] if any(r.get(f"{y}_ci") for r in records) else None
    ax.errorbar(xs, ys, yerr=yerr, marker="o", capsize=3, label=label, **style)


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

    # the paper's Figure 13: score vs step and vs wall time, smoothed; the evaluations beside it
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, steps, evals) in enumerate(runs):
        color = f"C{i % 10}"  # one colour per run in both panels, its evaluations included
        _smoothed(by_step, *_series(steps, "step", "episode_score_mean"), name, color)
        for size, same in _by_size(evals):
            _with_intervals(by_step, same, "mean_score", f"{name} evaluation{size}", color=color, linestyle="--")
        timed = [r for r in steps if "wall_time" in r and "elapsed_s" in r]
        if timed:  # minutes since the run began: a restarted learner's elapsed_s starts again from 0
            start = timed[0]["wall_time"] - timed[0]["elapsed_s"]
            minutes = [(r["wall_time"] - start) / 60 for r in timed]
            _smoothed(by_time, minutes, [r["episode_score_mean"] for r in timed], name, color)
    by_step.set(
        xlabel="learner step", ylabel="mean episode score (training batch; evaluation: test)", title="score vs step"
    )
    by_time.set(xlabel="wall time (min)", ylabel="mean episode score (training batch)", title="score vs wall time")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, "score.png")

    if any(evals for _, _, evals in runs):
        fig, (score, success) = plt.subplots(1, 2, figsize=(11, 4))
        for name, _, evals in runs:
            for size, same in _by_size(evals):
                _with_intervals(score, same, "mean_score", f"{name}{size}")
                _with_intervals(success, same, "mean_success_rate", f"{name}{size}", scale=100.0)
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

    if any(r.get(key) is not None for _, steps, _ in runs for r in steps for key in EXPLORATION):
        save(_exploration_figure(plt, runs), "exploration.png")

    if any(r.get("tip_turn_fraction") is not None for _, steps, _ in runs for r in steps):
        save(_memory_figure(plt, runs), "memory.png")

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


def _by_size(evals: list[dict]) -> list[tuple[str, list[dict]]]:
    """The eval records by evaluation size, with a label suffix: the periodic subset and a final
    evaluation of the same checkpoint are different measurements, one series each."""

    def size_of(record: dict) -> tuple:
        return record.get("variations_per_task"), record.get("episodes_per_variation")

    return [
        (f" ({size[0]} x {size[1]})" if size[0] else "", [r for r in evals if size_of(r) == size])
        for size in dict.fromkeys(map(size_of, evals))
    ]


def _exploration_figure(plt, runs: list[tuple[str, list[dict], list[dict]]]):
    """learner/exploration.py's metrics and the policy's entropy vs step (the paper's Figures 3 and 7)."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    (states, actions), (collapsed, entropy) = axes
    for name, steps, _ in runs:
        if not any(r.get(key) is not None for r in steps for key in EXPLORATION):
            continue  # a log from before they were recorded
        states.plot(*_series(steps, "step", "distinct_states_per_group"), marker=".", label=f"{name}: per group")
        states.plot(*_series(steps, "step", "distinct_states_per_episode"), marker=".", label=f"{name}: per episode")
        actions.plot(*_series(steps, "step", "distinct_actions_per_group"), marker=".", label=name)
        xs, ys = _series(steps, "step", "collapsed_group_fraction")
        collapsed.plot(xs, [100 * y for y in ys], marker=".", label=name)
        # 0 in a record of a run that did not measure it (before every step did, without entropy_coef)
        entropy.plot(*_series([r for r in steps if r.get("entropy_mean")], "step", "entropy_mean"), ".-", label=name)
    for ax, title in (
        (states, "distinct states (room, inventory, visible objects)"),
        (actions, "distinct actions per group"),
        (collapsed, "groups whose episodes share one state sequence (%)"),
        (entropy, "policy entropy at response tokens (nats)"),
    ):
        ax.set(xlabel="learner step", title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def _memory_figure(plt, runs: list[tuple[str, list[dict], list[dict]]]):
    """learner/memory_use.py's metrics vs step: how much EMPO2's memory engaged."""
    fig, (shares, counts) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, steps, _) in enumerate(runs):
        color = f"C{i % 10}"
        for key, style, label in (
            ("tip_turn_fraction", "o-", "turns that showed tips"),
            ("tip_samples_trained_fraction", "s--", "tip turns trained (kept by the mask)"),
            ("retrieval_hit_fraction", "^:", "tip-mode retrievals with >= 1 memory"),
        ):
            xs, ys = _series([r for r in steps if r.get(key) is not None], "step", key)
            shares.plot(xs, [100 * y for y in ys], style, color=color, label=f"{name}: {label}", markersize=4)
        for key, style, label in (("retrieval_hits_mean", "o-", "memories per retrieval"),):
            counts.plot(*_series([r for r in steps if r.get(key) is not None], "step", key), style, color=color,
                        label=f"{name}: {label}", markersize=4)  # fmt: skip
        xs, ys = _series([r for r in steps if r.get("r_int_spread_mean") is not None], "step", "r_int_spread_mean")
        counts.plot(xs, [10 * y for y in ys], "s--", color=color, label=f"{name}: r_int's std in a group x 10")
    shares.set(xlabel="learner step", ylabel="% of the batch's turns / tip turns", title="memory use per step")
    shares.set_ylim(-5, 105)
    counts.set(xlabel="learner step", ylabel="count (r_int std x 10)", title="retrievals and the intrinsic reward")
    for ax in (shares, counts):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def plot_arms(arms: dict[str, list[Path]], out: Path) -> Path:
    """curves.png: per arm (a method trained with several seeds), the training batches' success rate and
    mean score vs learner step: the mean over its seeds as a line in the band of their min and max (a
    step is drawn where every seed has it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (arm, dirs) in enumerate(arms.items()):
        seeds = [{r["step"]: r for r in read_log(d)[0]} for d in dirs]
        common = sorted(set.intersection(*(set(s) for s in seeds))) if seeds else []
        for ax, key, scale in ((axes[0], "success_rate", 100.0), (axes[1], "episode_score_mean", 1.0)):
            values = [[scale * s[step][key] for s in seeds] for step in common]
            mean = [sum(v) / len(v) for v in values]
            ax.plot(common, mean, "-", color=f"C{i % 10}", label=f"{arm}: mean of {len(dirs)} seeds")
            ax.fill_between(common, [min(v) for v in values], [max(v) for v in values], color=f"C{i % 10}", alpha=0.2)
    axes[0].set(xlabel="learner step", ylabel="success rate (%)", title="training success (band: min-max over seeds)")
    axes[1].set(xlabel="learner step", ylabel="score (0-100; -100: a wrong focus)", title="training score")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="empo2-plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories holding metrics.jsonl")
    parser.add_argument("--out", type=Path, default=None, help="where the PNGs go (default <first run>/plots)")
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME=DIR,DIR,...",
        help="also curves.png: an arm's seeds (run dirs) as a mean in a min-max band; repeat per arm",
    )
    args = parser.parse_args(argv)
    try:
        written = plot_runs(args.run_dirs, args.out or args.run_dirs[0] / "plots")
        arms = {name: [Path(d) for d in dirs.split(",")] for name, _, dirs in (a.partition("=") for a in args.arm)}
        if arms:
            written.append(plot_arms(arms, args.out or args.run_dirs[0] / "plots"))
    except FileNotFoundError as exc:
        print(f"empo2-plot: {exc}", file=sys.stderr)
        return 2
    print("\n".join(f"[plot] wrote {path}" for path in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
