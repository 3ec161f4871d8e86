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
  training.png        loss, clip fraction and masked fraction (as % of the batch) vs step
  exploration.png     distinct states per episode and per group, distinct actions per group, the
                      fraction of collapsed groups (learner/exploration.py) and the policy's
                      entropy, vs step: written when the records carry them
  memory.png          EMPO2's memory at work (learner/memory_use.py): turns that showed tips, tip turns
                      trained, retrievals that hit, memories per retrieval, r_int's spread in a group:
                      written when the records carry them
  curves.png          with --arm NAME=DIR,DIR,... (repeated): per arm, its seeds' training success and
                      score vs step, the mean in a band of the min and max over seeds
  time_breakdown.png  per run, seconds per step: the learner's phases stacked (samples, score,
                      forward/backward, optimizer, push, ...) with its batch wait as a hatched bar
                      beside them (idle time, not part of the step), and the actors' rollout phases
                      stacked (generation, env step, memory retrieval, ...) (the paper's Figure 12)
A figure without data in any run (eval.png before any evaluation) is not written; the command
says which it wrote. Every step axis has whole steps; fractions are drawn as 0-100 %, counts from 0;
legends sit below the panels (time_breakdown: beside them), so they cover no data.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from common.metrics import read_log
from learner.exploration import METRICS as EXPLORATION

SMOOTHING = 5  # steps in the training score's moving average (score.png)
BAND = f"{SMOOTHING}-step moving mean ± 1 std"  # what score.png's line and band are, in its legend
SCORE = "score\n(0 to 100; -100: a failed focus)"  # ScienceWorld's episode score, an axis label
WAIT = "batch_wait"  # the learner's idle phase: time_breakdown.png draws it beside the step, not in it


def _step_axis(ax, label: str = "learner step") -> None:
    """An x axis of learner steps: whole steps only (no 1.2, 1.4 with a few steps). Called once the
    panel is drawn: a range under 2 steps (a run of one step) is widened to 2, which has whole ticks."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel(label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    low, high = ax.get_xlim()
    if high - low < 2:
        ax.set_xlim((low + high) / 2 - 1, (low + high) / 2 + 1)


def _percent_axis(ax, label: str) -> None:
    """A y axis of fractions drawn as percents: 0 to 100 % with a margin, whatever the data (a fraction
    that stays 0 is a line at 0 %, not noise on a -0.04 to 0.04 axis)."""
    from matplotlib.ticker import PercentFormatter

    ax.set_ylabel(label)
    ax.set_ylim(-4, 104)
    ax.yaxis.set_major_formatter(PercentFormatter(100, decimals=0))


def _from_zero(ax) -> None:
    """A y axis of counts (never negative) from 0, and at least to 1: counts that stay 0 are a line at
    the bottom, not noise on a -0.04 to 0.04 axis."""
    high = ax.get_ylim()[1]
    ax.set_ylim(0, max(high, 1.0))


def _figure_legend(fig, axes, title: str | None = None, ncol: int = 2) -> None:
    """One legend for the figure's panels (their entries by label, once each), below them: it covers no data."""
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:  # long labels (a long run name) wrapped, and in fewer columns: the legend fits the figure's width
        labels = [textwrap.fill(label, 55, break_on_hyphens=False) for label in entries]
        longest = max(len(line) for label in labels for line in label.splitlines()) + 8  # + the handle
        ncol = max(1, min(ncol, len(entries), int(14 * fig.get_figwidth()) // longest))  # ~14 characters an inch
        fig.legend(list(entries.values()), labels, loc="outside lower center", ncol=ncol, fontsize=8, title=title,
                   title_fontsize=8, frameon=False)  # fmt: skip


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
    ax.plot(xs, mean, color=color, label=f"{label}: training batches, {BAND}")
    ax.fill_between(xs, low, high, color=color, alpha=0.15)


def _with_intervals(ax, records: list[dict], y: str, label: str, scale: float = 1.0, **style) -> None:
    """`y` vs step; error bars where a record carries its interval ("<y>_ci": [low, high])."""
    records = [r for r in records if r.get("step") is not None and r.get(y) is not None]
    xs, ys = [r["step"] for r in records], [scale * r[y] for r in records]
    bounds = [r.get(f"{y}_ci") or [r[y], r[y]] for r in records]
    below = [y_ - scale * lo for y_, (lo, _) in zip(ys, bounds)]
    above = [scale * hi - y_ for y_, (_, hi) in zip(ys, bounds)]
    yerr = [below, above] if any(r.get(f"{y}_ci") for r in records) else None
    ax.errorbar(xs, ys, yerr=yerr, marker="o", capsize=3, label=label + (", 95% CI" if yerr else ""), **style)


def plot_runs(run_dirs: list[Path], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    runs = [(d.resolve().name, *read_log(d)) for d in run_dirs]
    written: list[Path] = []

    def save(fig, name: str) -> None:
        path = out / name
        fig.savefig(path, dpi=110)  # the figures' constrained layout keeps titles and legends inside
        plt.close(fig)
        written.append(path)

    # the paper's Figure 13: score vs step and vs wall time, smoothed; the evaluations beside it
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4.6), layout="constrained")
    timed_runs = [[r for r in steps if "wall_time" in r and "elapsed_s" in r] for _, steps, _ in runs]
    # since the run began (a restarted learner's elapsed_s starts again from 0); a long run in hours
    hours = any(t and t[-1]["elapsed_s"] > 3 * 3600 for t in timed_runs)
    for i, ((name, steps, evals), timed) in enumerate(zip(runs, timed_runs)):
        color = f"C{i % 10}"  # one colour per run in both panels, its evaluations included
        _smoothed(by_step, *_series(steps, "step", "episode_score_mean"), name, color)
        for size, same in _by_size(evals):
            _with_intervals(by_step, same, "mean_score", f"{name}: evaluation (test){size}", color=color,
                            linestyle="--")  # fmt: skip
        if timed:
            start = timed[0]["wall_time"] - timed[0]["elapsed_s"]
            times = [(r["wall_time"] - start) / (3600 if hours else 60) for r in timed]
            _smoothed(by_time, times, [r["episode_score_mean"] for r in timed], name, color)
    _step_axis(by_step)
    by_step.set(ylabel=f"mean episode {SCORE}", title="score vs learner step")
    by_time.set(xlabel=f"wall time since the run began ({'h' if hours else 'min'})", ylabel=f"mean episode {SCORE}",
                title="score vs wall time")  # fmt: skip
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
    _figure_legend(fig, (by_step, by_time), title="dots: each step's batch mean")
    save(fig, "score.png")

    if any(evals for _, _, evals in runs):
        fig, (score, success) = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
        for i, (name, _, evals) in enumerate(runs):
            for j, (size, same) in enumerate(_by_size(evals)):
                style = {"color": f"C{i % 10}", "linestyle": ("-", "--", ":")[j % 3]}
                _with_intervals(score, same, "mean_score", f"{name}{size}", **style)
                _with_intervals(success, same, "mean_success_rate", f"{name}{size}", scale=100.0, **style)
        score.set(ylabel=f"test {SCORE}", title="evaluation score (mean over tasks)")
        _percent_axis(success, "test success rate")
        success.set_title("evaluation success")
        for ax in (score, success):
            _step_axis(ax, "learner step (checkpoint evaluated)")
            ax.grid(alpha=0.3)
        _figure_legend(fig, (score, success))
        save(fig, "eval.png")

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4), layout="constrained")
    for ax, key, title in zip(
        axes,
        ("loss", "clip_fraction", "masked_fraction"),
        ("policy loss", "tokens whose ratio was clipped", "samples masked out of the loss"),
    ):
        for i, (name, steps, _) in enumerate(runs):
            xs, ys = _series(steps, "step", key)
            ax.plot(xs, ys if key == "loss" else [100 * y for y in ys], marker=".", color=f"C{i % 10}", label=name)
        if key == "loss":
            ax.set_ylabel("loss (the step's mean)")
        else:
            _percent_axis(ax, "% of the batch's " + ("response tokens" if key == "clip_fraction" else "turn samples"))
        _step_axis(ax)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    _figure_legend(fig, axes, ncol=4)
    save(fig, "training.png")

    if any(r.get(key) is not None for _, steps, _ in runs for r in steps for key in EXPLORATION):
        save(_exploration_figure(plt, runs), "exploration.png")

    if any(r.get("tip_turn_fraction") is not None for _, steps, _ in runs for r in steps):
        save(_memory_figure(plt, runs), "memory.png")

    # the paper's Figure 12: where the time goes, per component
    save(_time_figure(plt, runs), "time_breakdown.png")
    return written


def _title(ax, name: str, what: str, width: int = 60) -> None:
    """A run's panel title: its name (wrapped to the panel's width: a long one does not run off the
    figure) over what the panel shows."""
    ax.set_title(textwrap.fill(name, width, break_on_hyphens=False) + "\n" + what, fontsize=10)


def _time_figure(plt, runs: list[tuple[str, list[dict], list[dict]]]):
    """Per run, seconds per learner step: the learner's phases stacked (the step's work) with its batch
    wait as a hatched bar beside them (idle time, not part of the step), and the actor-seconds of the
    batch's episodes by rollout phase (the paper's Figure 12)."""
    fig, axes = plt.subplots(len(runs), 2, figsize=(14, 3.9 * len(runs)), squeeze=False, layout="constrained")
    for (name, steps, _), (learner_ax, actor_ax) in zip(runs, axes):
        xs = [r["step"] for r in steps]
        for ax, key in ((learner_ax, "phase_seconds"), (actor_ax, "rollout_phase_seconds")):
            phases = list(dict.fromkeys(p for r in steps for p in r.get(key, {})))
            apart = key == "phase_seconds" and WAIT in phases
            width = 0.4 if apart else 0.8
            at = [x - width / 2 for x in xs] if apart else xs
            bottom = [0.0] * len(steps)
            for phase in (p for p in phases if not (apart and p == WAIT)):
                heights = [r.get(key, {}).get(phase, 0.0) for r in steps]
                ax.bar(at, heights, width=width, bottom=bottom, label=phase)
                bottom = [b + h for b, h in zip(bottom, heights)]
            top = max(bottom, default=0.0)
            if apart:
                waits = [r.get(key, {}).get(WAIT, 0.0) for r in steps]
                ax.bar([x + width / 2 for x in xs], waits, width=width, color="white", edgecolor="0.45", hatch="///",
                       label="batch wait (idle, beside the step)")  # fmt: skip
                top = max(top, *waits)
            ax.set_ylim(0, 1.1 * top or 1.0)  # the tallest bar whole
            _step_axis(ax)
            ax.grid(axis="y", alpha=0.3)
            if phases:
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False)
        learner_ax.set_ylabel("seconds (wall)")
        _title(learner_ax, name, "learner: seconds per step, by phase")
        actor_ax.set_ylabel("actor-seconds (summed over episodes)")
        _title(actor_ax, name, "actors: time in the batch's episodes, by phase")
    return fig


def _by_size(evals: list[dict]) -> list[tuple[str, list[dict]]]:
    """The eval records by evaluation size, with a label suffix: the periodic subset and a final
    evaluation of the same checkpoint are different measurements, one series each."""

    def size_of(record: dict) -> tuple:
        return record.get("variations_per_task"), record.get("episodes_per_variation")

    return [
        (f" ({size[0]} variations x {size[1]} episodes)" if size[0] else "", [r for r in evals if size_of(r) == size])
        for size in dict.fromkeys(map(size_of, evals))
    ]


def _exploration_figure(plt, runs: list[tuple[str, list[dict], list[dict]]]):
    """learner/exploration.py's metrics and the policy's entropy vs step (the paper's Figures 3 and 7)."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.6), layout="constrained")
    (states, actions), (collapsed, entropy) = axes
    for i, (name, steps, _) in enumerate(runs):
        if not any(r.get(key) is not None for r in steps for key in EXPLORATION):
            continue  # a log from before they were recorded
        color = f"C{i % 10}"  # one colour per run in every panel
        states.plot(*_series(steps, "step", "distinct_states_per_group"), ".-", color=color, label=name)
        states.plot(*_series(steps, "step", "distinct_states_per_episode"), ".--", color=color)
        actions.plot(*_series(steps, "step", "distinct_actions_per_group"), ".-", color=color, label=name)
        xs, ys = _series(steps, "step", "collapsed_group_fraction")
        collapsed.plot(xs, [100 * y for y in ys], ".-", color=color, label=name)
        # 0 in a record of a run that did not measure it (before every step did, without entropy_coef)
        entropy.plot(*_series([r for r in steps if r.get("entropy_mean")], "step", "entropy_mean"), ".-", color=color,
                     label=name)  # fmt: skip
    states.set(ylabel="distinct states", title="distinct states (room, inventory, objects seen):\n"
               "per group (solid), per episode (dashed)")  # fmt: skip
    actions.set(ylabel="distinct actions", title="distinct actions per group")
    _percent_axis(collapsed, "% of the batch's groups")
    collapsed.set_title("groups whose episodes share one state sequence")
    entropy.set(ylabel="entropy (nats per token)", title="policy entropy at response tokens")
    for ax in (states, actions, entropy):
        _from_zero(ax)
    for ax in axes.flat:
        _step_axis(ax)
        ax.grid(alpha=0.3)
    _figure_legend(fig, axes.flat, ncol=4)
    return fig


def _memory_figure(plt, runs: list[tuple[str, list[dict], list[dict]]]):
    """learner/memory_use.py's metrics vs step: how much EMPO2's memory engaged."""
    fig, (shares, counts) = plt.subplots(1, 2, figsize=(11, 5.5), layout="constrained")
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
    _percent_axis(shares, "% of the batch's turns\n(tip turns trained: % of tip turns)")
    shares.set_title("memory use per step")
    counts.set(ylabel="memories (r_int std x 10)", title="retrievals and the intrinsic reward")
    _from_zero(counts)
    for ax in (shares, counts):
        _step_axis(ax)
        ax.grid(alpha=0.3)
    _figure_legend(fig, (shares, counts))
    return fig


def plot_arms(arms: dict[str, list[Path]], out: Path) -> Path:
    """curves.png: per arm (a method trained with several seeds), the training batches' success rate and
    mean score vs learner step: the mean over its seeds as a line in the band of their min and max (a
    step is drawn where every seed has it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
    for i, (arm, dirs) in enumerate(arms.items()):
        seeds = [{r["step"]: r for r in read_log(d)[0]} for d in dirs]
        common = sorted(set.intersection(*(set(s) for s in seeds))) if seeds else []
        for ax, key, scale in ((axes[0], "success_rate", 100.0), (axes[1], "episode_score_mean", 1.0)):
            values = [[scale * s[step][key] for s in seeds] for step in common]
            mean = [sum(v) / len(v) for v in values]
            ax.plot(common, mean, "-", color=f"C{i % 10}", label=f"{arm}: mean of {len(dirs)} seeds, band min-max")
            ax.fill_between(common, [min(v) for v in values], [max(v) for v in values], color=f"C{i % 10}", alpha=0.2)
    _percent_axis(axes[0], "success rate (training batches)")
    axes[0].set_title("training success")
    axes[1].set(ylabel=f"mean episode {SCORE}", title="training score")
    for ax in axes:
        _step_axis(ax)
        ax.grid(alpha=0.3)
    _figure_legend(fig, axes)
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
