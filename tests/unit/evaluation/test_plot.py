"""empo2-plot renders a recorded metrics log (a small fixture: 6 learner steps, 2 evaluations,
one cut line) into non-empty PNGs, also with two runs overlaid; a run without a log is refused.
A hand-made log with the exploration metrics, the entropy and evaluations with intervals adds their
figure; the moving average's band and the intervals' error bars are checked by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evaluation.plot import _with_intervals, main, moving_band, read_log

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
