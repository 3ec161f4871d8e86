"""empo2-plot renders a recorded metrics log (a small fixture: 6 learner steps, 2 evaluations,
one cut line) into non-empty PNGs, also with two runs overlaid; a run without a log is refused.
A hand-made log with the exploration metrics, the entropy and evaluations with intervals adds their
figure; the moving average's band and the intervals' error bars are checked by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from common.metrics import read_log
from evaluation.plot import _step_axis, _with_intervals, main, moving_band

FIXTURE = Path(__file__).parent / "fixtures" / "run_a"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_read_log_splits_steps_and_evals_and_skips_a_cut_line():
    steps, evals = read_log(FIXTURE)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in evals] == [3, 6]


def test_plot_writes_every_figure_for_two_runs(tmp_path, capsys):
    other = tmp_path / "run_b"
    shutil.copytree(FIXTURE, other)
    out = tmp_path / "plots"
    assert main([str(FIXTURE), str(other), "--out", str(out)]) == 0
    names = {"score.png", "eval.png", "training.png", "time_breakdown.png"}
    assert {p.name for p in out.iterdir()} == names
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, name  # a drawn figure, not an empty canvas
    assert capsys.readouterr().out.count("[plot] wrote") == 4


def test_a_run_without_a_metrics_log_is_refused(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no metrics log" in capsys.readouterr().err


def test_moving_band_is_the_trailing_mean_plus_minus_the_windows_std():
    means, lows, highs = moving_band([0.0, 10.0, 20.0, 30.0, 40.0, 50.0], window=5)
    assert means == pytest.approx([0, 5, 10, 15, 20, 30])
    assert lows[:2] == pytest.approx([0, 0]) and highs[:2] == pytest.approx([0, 10])  # [0], then [0, 10]: std 5
    assert highs[5] - means[5] == pytest.approx(200**0.5)  # [10 .. 50]: deviations 20, 10, 0, 10, 20
    assert moving_band([3.0, -1.0], window=1) == ([3.0, -1.0], [3.0, -1.0], [3.0, -1.0])


class _Axes:
    def errorbar(self, xs, ys, yerr=None, **style):
        self.drawn = (xs, ys, yerr)


def test_evaluations_get_error_bars_from_their_intervals():
    evals = [
        {"step": 5, "mean_score": 10.0, "mean_score_ci": [4.0, 13.0]},
        {"step": 10, "mean_score": 20.0},  # no interval: a bar of length 0
    ]
    ax = _Axes()
    _with_intervals(ax, evals, "mean_score", "run")
    assert ax.drawn == ([5, 10], [10.0, 20.0], [[6.0, 0.0], [3.0, 0.0]])
    _with_intervals(ax, evals[1:], "mean_score", "run")
    assert ax.drawn[2] is None  # no record with an interval: plain points


def _exploring_run(run_dir: Path, steps: int = 12) -> None:
    """A hand-made log: steps with the exploration metrics and the entropy, two evaluations with intervals."""
    run_dir.mkdir()
    lines = []
    for step in range(1, steps + 1):
        record = {
            "record": "step",
            "step": step,
            "episode_score_mean": (-1) ** step * 30.0 + step,  # a batch mean swinging by +-30
            "loss": 0.1,
            "clip_fraction": 0.01,
            "masked_fraction": 0.2,
            "phase_seconds": {"forward_backward": 1.0},
            "distinct_states_per_episode": 4.0 + step / 4,
            "distinct_states_per_group": 9.0 + step / 2,
            "distinct_actions_per_group": 6.0 + step / 3,
            "collapsed_group_fraction": 0.5 if step < 4 else None if step == 6 else 0.25,
            "entropy_mean": 0.0 if step == 1 else 2.0 - step / 10,  # 0: not measured
            "success_rate": 0.25 * (step % 3 == 0),
            # the memory's use (learner/memory_use.py); None before the memory held anything
            "tip_turn_fraction": None if step < 3 else 0.3,
            "tip_samples_trained_fraction": None if step < 3 else 1.0,
            "retrieval_hit_fraction": None if step < 3 else 0.6,
            "retrieval_hits_mean": None if step < 3 else 2.5,
            "r_int_spread_mean": None if step < 3 else 0.1,
        }
        lines.append(json.dumps(record))
        if step % 6 == 0:
            lines.append(json.dumps({"record": "eval", "step": step, "mean_score": step, "mean_success_rate": 0.1,
                                     "mean_score_ci": [step - 5, step + 4], "mean_success_rate_ci": [0.0, 0.3],
                                     "variations_per_task": 5, "episodes_per_variation": 4}))  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_a_log_with_exploration_and_intervals_draws_every_figure(tmp_path):
    _exploring_run(tmp_path / "explorer")
    out = tmp_path / "plots"
    assert main([str(tmp_path / "explorer"), str(FIXTURE), "--out", str(out)]) == 0  # old and new logs overlaid
    names = {"score.png", "eval.png", "training.png", "exploration.png", "memory.png", "time_breakdown.png"}
    assert {p.name for p in out.iterdir()} == names
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, name


def test_arms_are_drawn_as_the_mean_of_their_seeds_in_a_min_max_band(tmp_path):
    for seed in range(3):
        _exploring_run(tmp_path / f"empo2_seed{seed}", steps=8 + seed)  # curves.png: the steps every seed has
    out = tmp_path / "plots"
    arm = "--arm=empo2=" + ",".join(str(tmp_path / f"empo2_seed{seed}") for seed in range(3))
    assert main([str(tmp_path / "empo2_seed0"), "--out", str(out), arm]) == 0
    data = (out / "curves.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


# A person reads the figures (issue 42 item 5): whole steps, labelled axes, fractions on 0-100 %, a
# legend that says what the band is, batch wait apart from the step's work, titles and legends that fit.
LONG_NAME = "empo2_qwen2.5-1.5b-instruct_seed0_20261207T031500_a_finished_run_with_a_long_name"


def _short_run(run_dir: Path) -> None:
    """Two steps (the few steps that gave 1.2, 1.4 ticks), fractions that stay 0, a learner that waited
    56 s for its batch and worked 41 s, one evaluation."""
    run_dir.mkdir()
    lines = [
        json.dumps(
            {
                "record": "step",
                "step": step,
                "episode_score_mean": 10.0 * step,
                "success_rate": 0.0,
                "loss": 0.2,
                "clip_fraction": 0.0,
                "masked_fraction": 0.0,
                "wall_time": 1000.0 + 100 * step,
                "elapsed_s": 100.0 * step,
                "collapsed_group_fraction": 0.0,
                "distinct_states_per_group": 3.0,
                "distinct_states_per_episode": 2.0,
                "distinct_actions_per_group": 3.0,
                "entropy_mean": 1.0,
                "tip_turn_fraction": 0.0,
                "tip_samples_trained_fraction": 0.0,
                "retrieval_hit_fraction": 0.0,
                "retrieval_hits_mean": 0.0,
                "r_int_spread_mean": 0.0,
                "phase_seconds": {
                    "batch_wait": 56.0,
                    "samples": 1.0,
                    "score": 8.0,
                    "forward_backward": 25.0,
                    "optimizer": 4.0,
                    "push": 3.0,
                },
                "rollout_phase_seconds": {"generation": 300.0, "env_step": 40.0},
            }
        )  # fmt: skip
        for step in (1, 2)
    ]
    lines.append(json.dumps({"record": "eval", "step": 2, "mean_score": 5.0, "mean_success_rate": 0.0}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture
def figures(tmp_path, monkeypatch) -> dict:
    """Every figure empo2-plot saves for the short run overlaid on the fixture, by file name."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    drawn, savefig = {}, Figure.savefig

    def record(fig, path, *args, **kwargs):
        savefig(fig, path, *args, **kwargs)
        drawn[Path(path).name] = fig
        FigureCanvasAgg(fig).draw()  # drawn again at its own dpi, laid out: the extents the tests read
        fig.renderer = fig.canvas.get_renderer()

    monkeypatch.setattr(Figure, "savefig", record)
    _short_run(tmp_path / LONG_NAME)
    assert main([str(tmp_path / LONG_NAME), str(FIXTURE), "--out", str(tmp_path / "plots")]) == 0
    assert set(drawn) == {"score.png", "eval.png", "training.png", "exploration.png", "memory.png",
                          "time_breakdown.png"}  # fmt: skip
    return drawn


def test_every_axis_is_labelled(figures):
    for name, fig in figures.items():
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_ylabel(), (name, ax.get_title())


def test_every_step_axis_has_whole_steps(figures):  # the short run's own panels span steps 1 to 2
    for name, fig in figures.items():
        assert any(ax.get_xlabel().startswith("learner step") for ax in fig.axes), name
        for ax in fig.axes:
            if ax.get_xlabel().startswith("learner step"):
                ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
                assert ticks and all(float(t).is_integer() for t in ticks), (name, ticks)


def test_a_run_of_one_step_has_whole_step_ticks_too():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    ax.plot([1], [0.1], ".")  # one step: matplotlib's own axis runs 0.945 to 1.05
    _step_axis(ax)
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert 1 in ticks and all(float(t).is_integer() for t in ticks), ticks


def test_fractions_are_drawn_on_0_to_100_percent(figures):
    training, exploration = figures["training.png"].axes, figures["exploration.png"].axes
    fraction_axes = [*training[1:], exploration[2], figures["memory.png"].axes[0], figures["eval.png"].axes[1]]
    for ax in fraction_axes:  # fractions that stayed 0: still 0 to 100 %, not -0.04 to 0.04
        low, high = ax.get_ylim()
        assert low <= 0 and high >= 100, (ax.get_title(), low, high)
        assert ax.yaxis.get_major_formatter()(100, 0) == "100%", ax.get_title()  # ticks read 0% .. 100%
    assert max(training[1].lines[0].get_ydata()) == 0  # drawn as percents: 0.0 -> 0 %
    assert figures["memory.png"].axes[1].get_ylim() == (0, 1)  # counts that stay 0: from 0, not around it


def test_the_score_legend_says_what_the_line_and_band_are(figures):
    fig = figures["score.png"]
    texts = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert any("5-step moving mean ± 1 std" in t for t in texts), texts


def test_batch_wait_is_drawn_beside_the_step_not_stacked_onto_it(figures):
    learner = figures["time_breakdown.png"].axes[0]  # the short run: 56 s waited, 41 s of work per step
    tops = [bar.get_y() + bar.get_height() for bar in learner.patches]
    assert max(tops) == pytest.approx(56.0)  # not 97: the wait is not on top of the step
    work = [bar.get_y() + bar.get_height() for bar in learner.patches if not bar.get_hatch()]
    assert max(work) == pytest.approx(41.0)
    assert learner.get_ylim()[1] < 97


def test_titles_and_legends_fit_the_figure_and_cover_no_data(figures):
    for name, fig in figures.items():
        renderer = fig.renderer
        inside = fig.bbox.padded(1)
        legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
        for ax in fig.axes:
            for text in (ax.title, ax.xaxis.label, ax.yaxis.label):
                box = text.get_window_extent(renderer)
                assert inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1), (name, text.get_text())
            for legend in legends:
                assert not legend.get_window_extent(renderer).overlaps(ax.bbox), (name, ax.get_title())
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, name
