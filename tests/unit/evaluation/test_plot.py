"""empo2-plot renders a recorded metrics log (a small fixture: 6 learner steps, 2 evaluations,
one cut line) into non-empty PNGs, also with two runs overlaid; a run without a log is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

from evaluation.plot import main, read_log

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
