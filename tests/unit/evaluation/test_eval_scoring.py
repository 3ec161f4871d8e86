"""empo2-eval's bookkeeping without servers: which episodes it plans, how it scores them, the
episodes file it resumes from, the settings it refuses to mix, the policy it resolves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.eval import (
    EpisodeLog,
    EvalError,
    PolicyChoice,
    check_settings,
    episode_key,
    markdown_table,
    plan,
    resolve_policy,
    summarize,
    write_results,
)
from pipeline.config import load_config
from protocol.messages import ON_POLICY


def test_plan_takes_the_first_test_variations_and_seeds_without_memory():
    assignments = plan(["boil", "melt"], {"boil": [5, 7, 9], "melt": [2]}, variations=2, episodes=3)
    assert [(a.task, a.variation, a.seed) for a in assignments] == [
        *[("boil", 5, s) for s in range(3)],
        *[("boil", 7, s) for s in range(3)],
        *[("melt", 2, s) for s in range(3)],
    ]
    assert {a.mode for a in assignments} == {ON_POLICY}  # the mode that never retrieves tips


def _record(task, variation, seed, score, done=True):
    return {
        "task": task,
        "variation": variation,
        "seed": seed,
        "score": score,
        "done": done,
        "success": done and score > 70,
    }


def test_summarize_std_over_seeds_and_success_rate():
    records = [
        _record("boil", 0, 0, 100),
        _record("boil", 1, 0, 50),
        _record("boil", 0, 1, 0),
        _record("boil", 1, 1, 50, done=False),
    ]
    [row] = summarize(records, ["boil", "melt"], 50.0)  # a task without episodes has no row
    assert row.seed_means == [75.0, 25.0]
    assert row.score_mean == pytest.approx(50.0)
    assert row.score_std == pytest.approx(35.3553, rel=1e-4)  # sample std of the two seed means
    assert row.success_rate == 0.25 and (row.variations, row.episodes) == (2, 4)
    # variation 0: scores 100 (success) and 0; variation 1: 50 and 50 (not done): k = 2 seeds each
    assert row.k == 2 and row.pass_at_1 == pytest.approx(0.25) and row.pass_at_k == pytest.approx(0.5)
    assert row.pass_score_at_1 == pytest.approx(0.75) and row.pass_score_at_k == pytest.approx(1.0)
    assert row.best_of_k == pytest.approx(75.0)


def test_table_puts_the_papers_numbers_beside_ours(tmp_path):
    rows = summarize([_record("find-animal", 0, 0, 100), _record("boil", 0, 0, 10)], ["find-animal", "boil"], 50.0)
    table = markdown_table(rows, "base", 1, 1, 50.0)
    assert "| find-animal | 1 x 1 | 100.0 ± – | 100% | 1.00 / 1.00 (k=1) | 1.00 / 1.00 | 100.0 | 100.0 ± 0.0 |" in table
    assert "| boil | 1 x 1 | 10.0 ± – | 0% | 0.00 / 0.00 (k=1) | 0.00 / 0.00 | 10.0 |  |  |" in table
    two_seeds = summarize([_record("boil", 0, 0, 10), _record("boil", 0, 1, 30)], ["boil"], 50.0)
    assert "| boil | 1 x 2 | 20.0 ± 14.1 | 0% |" in markdown_table(two_seeds, "base", 1, 2, 50.0)
    meta = {"policy": "base", "variations_per_task": 1, "episodes_per_variation": 1, "pass_score": 50.0}
    report = write_results(tmp_path, meta, rows, complete=True)
    assert report["mean_score"] == pytest.approx(55.0) and "mean_score_ci" not in report
    episodes = [_record("boil", 0, s, 10.0 * s) for s in range(4)]
    low, high = write_results(tmp_path, meta, summarize(episodes, ["boil"], 50.0), True, episodes)["mean_score_ci"]
    assert 0.0 <= low < 15.0 < high <= 30.0  # the bootstrap interval of the mean over episodes
    report = write_results(tmp_path, meta, rows, complete=True)
    assert json.loads((tmp_path / "results.json").read_text())["tasks"][0]["task"] == "find-animal"
    assert (tmp_path / "results.csv").read_text().splitlines()[1].startswith("find-animal,1,1,100.000")


def test_episode_log_appends_and_skips_a_cut_line(tmp_path):
    log = EpisodeLog(tmp_path / "episodes.jsonl")
    log.append(_record("boil", 3, 0, 20))
    with open(log.path, "a") as f:
        f.write('{"task": "boil", "varia')  # an interruption mid-line
    assert list(log.read()) == [episode_key("boil", 3, 0)]


def test_a_resume_with_other_settings_is_refused(tmp_path):
    check_settings(tmp_path, {"temperature": 0.4, "policy": "base"})
    check_settings(tmp_path, {"temperature": 0.4, "policy": "base"})  # the same: resumes
    with pytest.raises(EvalError, match="temperature"):
        check_settings(tmp_path, {"temperature": 1.0, "policy": "base"})


def _checkpoint(root: Path, name: str, complete: bool = True, old_layout: bool = False) -> Path:
    """step_N/model/ (the HF directory) beside step_N/trainer_state.pt; old_layout: both in step_N/."""
    path = root / "checkpoints" / name
    (path if old_layout else path / "model").mkdir(parents=True)
    (path if old_layout else path / "model").joinpath("config.json").write_text("{}")
    if complete:
        (path / "trainer_state.pt").write_bytes(b"")
    return path


def test_resolve_policy_base_latest_and_a_directory(tmp_path):
    cfg = load_config([f"run_dir={tmp_path}"])
    assert resolve_policy(cfg).label == "base" and resolve_policy(cfg).model == cfg.model.name
    cfg.eval.policy = "latest"
    with pytest.raises(EvalError, match="no complete checkpoint"):
        resolve_policy(cfg)
    _checkpoint(tmp_path, "step_000002", old_layout=True)  # a run written before the model/ directory
    _checkpoint(tmp_path, "step_000004")
    _checkpoint(tmp_path, "step_000006", complete=False)  # being written: not the latest
    assert resolve_policy(cfg).label == "step_000004"
    four = (tmp_path / "checkpoints" / "step_000004").resolve()
    assert resolve_policy(cfg).model == str(four / "model")  # the servers load the HF directory
    for given in (four, four / "model"):  # the checkpoint or its model directory: named after the step
        cfg.eval.policy = str(given)
        assert resolve_policy(cfg) == PolicyChoice("step_000004", str(four / "model"))
    cfg.eval.policy = str(tmp_path / "checkpoints" / "step_000002")
    assert resolve_policy(cfg).model == str((tmp_path / "checkpoints" / "step_000002").resolve())
    cfg.eval.policy = str(tmp_path)
    with pytest.raises(EvalError, match="not a checkpoint directory"):
        resolve_policy(cfg)


def test_eval_keys_are_validated():
    from common.config import ConfigError

    with pytest.raises(ConfigError, match="eval.tasks"):
        load_config(["eval.tasks=[not-a-task]"])
    with pytest.raises(ConfigError, match="eval.episodes"):
        load_config(["eval.episodes=0"])


def test_a_result_records_a_model_under_the_working_directory_relative_to_it(tmp_path, monkeypatch):
    """results.json is committed with the learning curves: it must not name this machine's directories."""
    from evaluation.eval import recorded_path

    monkeypatch.chdir(tmp_path)
    assert recorded_path(str(tmp_path / "runs" / "r" / "checkpoints" / "step_000020" / "model")) == (
        "runs/r/checkpoints/step_000020/model"
    )
    assert recorded_path("/elsewhere/model") == "/elsewhere/model"
    assert recorded_path("embedded:SmolLM2-135M-Instruct") == "embedded:SmolLM2-135M-Instruct"
