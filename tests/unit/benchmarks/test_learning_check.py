"""benchmarks/learning_check.py without processes: the 95% t-interval, and the base table
collected from an evaluation's episodes file."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

import benchmarks.learning_check as lc
from evaluation.eval import EpisodeLog


def test_confidence_interval_is_a_t_interval_over_seed_means():
    mean, half = lc.confidence_interval([10.0, 20.0, 30.0])
    assert mean == 20.0 and half == pytest.approx(4.303 * 10.0 / math.sqrt(3))
    assert math.isnan(lc.confidence_interval([5.0])[1])


def test_collect_writes_the_table_of_what_was_played(tmp_path, monkeypatch):
    out = tmp_path / "run" / "eval" / "base"
    out.mkdir(parents=True)
    (out / "settings.json").write_text(json.dumps({"model": "m", "temperature": 0.4}))
    log = EpisodeLog(out / "episodes.jsonl")
    for task, variation, score in (
        ("boil", 1, 0.0),
        ("boil", 2, 0.0),
        ("find-animal", 5, 25.0),
        ("find-animal", 6, 0.0),
    ):
        log.append({"task": task, "variation": variation, "seed": 0, "score": score, "done": False, "success": False})
    monkeypatch.setattr(lc, "RESULTS", tmp_path / "results")
    args = SimpleNamespace(variations=2, episodes=1)
    assert lc.collect(tmp_path / "run", ["boil", "find-animal", "melt"], [], args) == 0
    result = json.loads((tmp_path / "results" / "learning_check_base.json").read_text())
    assert result["tasks_evaluated"] == 2 and result["tasks_planned"] == 3 and result["complete"] is False
    assert result["tasks_with_signal"] == ["find-animal"]
    assert (
        "| find-animal | 2 x 1 | 12.5 ± – | 0% | 100.0 ± 0.0 | 72.4 ± 6.8 |"
        in (tmp_path / "results" / "learning_check_base.md").read_text()
    )
