"""benchmarks/learning_check.py without processes: the base table collected from an evaluation's
episodes file, and the paired comparison collected from hand-made evaluations of three policies."""

from __future__ import annotations

import json
import math
import sqlite3
from contextlib import closing
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

import benchmarks.learning_check as lc
from evaluation.eval import EpisodeLog, summarize
from memory_service.service import tip_text


def _evaluation(run_dir, scores: dict, variations=2, seeds=2):
    """A final evaluation's files: results.json (as empo2-eval writes it) and its episodes file."""
    out = run_dir / "eval" / "x"
    out.mkdir(parents=True)
    log = EpisodeLog(out / "episodes.jsonl")
    records = []
    for (variation, seed), score in scores.items():
        record = {"task": "boil", "variation": variation, "seed": seed, "score": score, "done": True}
        record["success"] = score > 70
        log.append(record)
        records.append(record)
    rows = summarize(records, ["boil"], 50.0)
    report = {"variations_per_task": variations, "episodes_per_variation": seeds, "tasks": [asdict(r) for r in rows]}
    (out / "results.json").write_text(json.dumps(report))
    (run_dir / "summary.json").write_text(
        json.dumps({"wall_seconds": 60, "server_versions_at_end": [3], "episodes": 8, "reflections": 0, "restarts": {}})
    )


def test_compare_pairs_the_policies_on_their_common_units(tmp_path, monkeypatch):
    monkeypatch.setattr(lc, "RESULTS", tmp_path / "results")
    (tmp_path / "results").mkdir()
    root = tmp_path / "runs"
    units = [(0, 0), (0, 1), (1, 0), (1, 1)]
    _evaluation(root / "base", dict.fromkeys(units, 0.0))
    for seed, shift in ((0, 10.0), (1, 30.0)):  # two training seeds: a unit's EMPO2 score is their mean, 20
        _evaluation(root / "empo2" / f"seed{seed}", {u: shift for u in units})
    _evaluation(root / "grpo" / "seed0", {u: 5.0 * i for i, u in enumerate(units)})
    args = SimpleNamespace(
        tasks=["boil"],
        variations=2,
        episodes=2,
        seeds=[0, 1],
        budget_min=1.0,
        steps=0,
        lr=1e-5,
        presets=["empo2", "grpo"],
        spa=[],
        report="learning_check_compare",
        plots="learning_check_plots",
        measure="score",
    )
    assert lc.collect_compare(root, args) == 0
    result = json.loads((tmp_path / "results" / "learning_check_compare.json").read_text())
    assert result["policies"]["empo2"]["mean"] == pytest.approx(20.0)
    assert result["policies"]["grpo"]["mean"] == pytest.approx(7.5) and result["policies"]["base"]["n"] == 4
    pairs = {(p["a"], p["b"]): p for p in result["pairs"]}
    assert pairs[("empo2", "base")]["difference"]["mean"] == pytest.approx(20.0)
    assert pairs[("empo2", "base")]["p_value"] == pytest.approx(2 / 16)  # 4 equal positive differences
    assert pairs[("empo2", "grpo")]["difference"]["mean"] == pytest.approx(12.5)
    assert set(result["training"]) == {"empo2/seed0", "empo2/seed1", "grpo/seed0"}  # grpo/seed1 left out
    table = (tmp_path / "results" / "learning_check_compare.md").read_text()
    assert "| empo2 − base | 20.0 [20.0, 20.0] | 0.125 |" in table
    assert "| empo2/seed0 | - | - |" in table  # the diagnostics row of a run without metrics
    assert result["units"]["empo2"] == {"boil/0/0": 20.0, "boil/0/1": 20.0, "boil/1/0": 20.0, "boil/1/1": 20.0}
    # the variation-clustered CI of a constant difference collapses; the unit-level p-values' Holm family:
    # 0.125 (empo2 - base), 0.25 (grpo - base: 0, 5, 10, 15), 0.125 (empo2 - grpo) -> 3 x 0.125, then monotone
    assert pairs[("empo2", "base")]["clustered_difference"]["ci_low"] == pytest.approx(20.0)
    assert [p["holm"]["unit_permutation"] for p in result["pairs"]] == pytest.approx([0.375] * 3)
    assert result["policies"]["empo2"]["seed_means"] == [10.0, 30.0] and result["policies"]["base"]["seeds"] == 0
    assert result["seed_units"]["empo2"]["seed1"]["boil/1/0"] == 30.0 and list(result["seed_units"]["grpo"]) == [
        "seed0"
    ]
    # seed level against the base model: the per-seed differences 10 and 30, t = 20 / (sd / sqrt 2) = 2 with 1 df
    seed = pairs[("empo2", "base")]["seed_level"]
    assert seed["design"] == "paired" and seed["seed_values_a"] == [10.0, 30.0] and seed["above_in_every_seed"]
    assert seed["t"] == pytest.approx(2.0) and seed["p_t"] == pytest.approx(1 - 2 * math.atan(2.0) / math.pi)
    assert seed["p_permutation"] == seed["p_floor"] == 0.5  # 2 seeds: 2 / 2^2
    assert pairs[("empo2", "base")]["holm"]["seed_t"] == pytest.approx(seed["p_t"])  # the only t p defined
    # between methods: 2 vs 1 seeds, Welch undefined; the permutation test splits 10, 30, 7.5 three ways,
    # |20 - 7.5| = 12.5 reached by 2 of them
    between = pairs[("empo2", "grpo")]["seed_level"]
    assert between["design"] == "independent" and between["p_t"] is None
    assert between["p_permutation"] == pytest.approx(2 / 3) and between["p_floor"] == pytest.approx(1 / 3)
    assert pairs[("empo2", "grpo")]["holm"]["seed_t"] is None
    assert "| empo2 − base | 2 vs the fixed policy | +10.0, +30.0 | 20.0 | 2.00 (1.0) |" in table
    assert (
        "with 2 training seeds against a fixed policy, the exact sign-flip test (2 / 2^2) cannot go below p = 0.5"
        in table
    )
    assert (
        "Holm's step-down adjustment" in table and "| base | 0.0 [0.0, 0.0] | 4 | [0.0, 0.0] | 0% [0%, 0%] |" in table
    )


def test_a_policy_reports_its_success_rate_and_its_rate_of_scores_of_50_beside_its_mean(tmp_path):
    def record(score, done=True):
        return {"score": score, "done": done, "success": done and score > 70}

    seeds = [
        {("t", 0, 0): record(80.0), ("t", 1, 0): record(40.0)},
        {("t", 0, 0): record(60.0), ("t", 1, 0): record(100.0)},
    ]
    summary = lc.policy_summary(seeds, fixed=False)
    assert summary["mean"] == pytest.approx(70.0) and summary["seed_means"] == [60.0, 80.0]
    assert summary["success_rate"]["mean"] == pytest.approx(0.5)  # one success of two seeds on each unit
    assert summary["rate_50"]["mean"] == pytest.approx(0.75)  # 80, 60 on the first unit; 100 of 40, 100 on the second
    assert lc.policy_summary([{("t", 0, 0): record(90.0, done=False)}], fixed=True)["success_rate"]["mean"] == 0.0


def test_each_method_is_compared_with_the_base_model_then_with_grpo():
    assert lc.pairs(["empo2", "grpo", "herl"]) == [
        ("empo2", "base"), ("grpo", "base"), ("herl", "base"), ("empo2", "grpo"), ("herl", "grpo")
    ]  # fmt: skip
    assert lc.pairs(["herl"]) == [("herl", "base")]
    assert lc.pairs(["s=empo2", "grpo", "empo2"], spa=["s"]) == [
        ("s", "base"), ("grpo", "base"), ("empo2", "base"), ("s", "grpo"), ("empo2", "grpo"),
        ("s_sft", "base"), ("s", "s_sft"), ("s", "empo2"),
    ]  # fmt: skip


def test_a_step_budget_gives_every_run_the_same_learner_steps_under_a_wall_limit(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(lc.subprocess, "run", lambda argv, **kw: ran.append(argv))
    args = SimpleNamespace(
        steps=8,
        budget_min=30.0,
        checkpoint_every=2,
        lr=1e-5,
        eval_every=0,
        lock="",
        micro_batch_tokens=1024,
        overrides=[],
    )
    lc.train("grpo", ["preset=grpo"], 1, tmp_path, ["boil"], args)
    lc.train("grpo", ["preset=grpo"], 1, tmp_path, ["boil"], SimpleNamespace(**{**vars(args), "steps": 0}))
    (steps, *_), (wall, *_) = ([a for a in argv if a.startswith("learner.total_steps=")] for argv in ran)
    assert steps == "learner.total_steps=8" and wall == "learner.total_steps=100000"  # 0: the wall budget ends it
    assert all("launch.timeout_s=1800.0" in argv for argv in ran)
    assert "8 learner steps (at most 30 min)" in lc.compare_table(
        {"design": {**vars(args), "tasks": ["boil"], "variations": 1, "eval_seeds": 1, "training_seeds": [1]},
         "policies": {}, "pairs": [], "evaluations": [], "training": {}}
    )  # fmt: skip


def test_a_method_is_a_preset_or_a_named_variant_of_one():
    assert lc.method_overrides("herl") == ("herl", ["preset=herl"])
    assert lc.method_overrides("herl_stripped=herl,herl.train_context=stripped") == (
        "herl_stripped",
        ["preset=herl", "herl.train_context=stripped"],
    )
    dirs = lc.run_dirs(Path("/r"), [0, 1], ["grpo", "herl_stripped=herl,herl.train_context=stripped"])
    assert dirs["herl_stripped"] == [Path("/r/herl_stripped/seed0"), Path("/r/herl_stripped/seed1")]
    assert lc.pairs(["grpo", "herl_stripped"]) == [
        ("grpo", "base"),
        ("herl_stripped", "base"),
        ("herl_stripped", "grpo"),
    ]


def test_compare_trains_only_the_runs_not_yet_evaluated_on_the_design(tmp_path, monkeypatch):
    """A compare with one more method adds it: the base model and the runs already evaluated are kept."""
    args = SimpleNamespace(tasks=["boil"], run_root=str(tmp_path), variations=1, episodes=1, collect=False, steps=0,
                           seeds=[0], presets=["grpo", "v=herl,herl.gamma=0.1"], lock="", spa=[],
                           overrides=[])  # fmt: skip
    monkeypatch.setattr(
        lc, "check_design_horizon", lambda a: None
    )  # boil's gold paths: tests/unit/benchmarks/test_horizon.py
    done = {tmp_path / "base", tmp_path / "grpo" / "seed0"}
    monkeypatch.setattr(lc, "final_evaluation", lambda run_dir, a, step=None: {} if run_dir in done else None)
    trained, evaluated = [], []
    monkeypatch.setattr(lc, "train", lambda name, method, seed, run_dir, tasks, a: trained.append((name, method)))
    monkeypatch.setattr(lc, "_eval", lambda run_dir, lock, overrides: evaluated.append((run_dir, overrides[:2])))
    monkeypatch.setattr(lc, "collect_compare", lambda root, a: 0)
    assert lc.compare(args) == 0
    assert trained == [("v", ["preset=herl", "herl.gamma=0.1"])]
    assert evaluated == [(tmp_path / "v" / "seed0", ["preset=herl", "herl.gamma=0.1"])]


def test_a_training_run_keeps_its_micro_batches_at_1024_by_default(tmp_path, monkeypatch):
    """The check's runs have the periodic evaluation's engine beside the learner: not the profile's 4096."""
    runs = []
    monkeypatch.setattr(lc.subprocess, "run", lambda argv, cwd: runs.append(argv))
    args = lc.build_parser().parse_args(["compare", "--tasks", "boil", "--steps", "2"])
    lc.train("grpo", ["preset=grpo"], 0, tmp_path, ["boil"], args)
    assert "learner.micro_batch_tokens=1024" in runs[0]
    lc.train(
        "grpo",
        ["preset=grpo"],
        0,
        tmp_path,
        ["boil"],
        lc.build_parser().parse_args(["compare", "--tasks", "boil", "--micro-batch-tokens", "4096"]),
    )
    assert "learner.micro_batch_tokens=4096" in runs[1]


def test_an_spa_method_trains_each_seed_from_one_timed_warm_start_and_reports_it(tmp_path, monkeypatch):
    """--spa: `empo2-spa all` runs once per method, before its seeds; each seed trains and is evaluated from
    the SFT checkpoint (model.name); the report gives the warm start's time and the SFT's held-out figures."""
    args = SimpleNamespace(tasks=["boil"], run_root=str(tmp_path), variations=1, episodes=1, collect=False, steps=0,
                           seeds=[0, 1], presets=["s=empo2"], lock="", spa=["s"], overrides=[])  # fmt: skip
    monkeypatch.setattr(lc, "check_design_horizon", lambda a: None)
    stage = tmp_path / "s" / lc.SPA_STAGE
    checkpoint = stage / "spa" / "sft" / "step_2"
    spa_runs = []

    def run_spa(argv, **kw):
        assert "empo2-spa" in argv and f"run_dir={stage}" in argv and "replay_buffer.tasks=[boil]" in argv
        spa_runs.append(argv)
        held = {"loss": 1.2, "tokens": 10, "next_state_accuracy": 0.2, "predictions": 5}
        report = {
            "before": held,
            "epochs": [{"held_out": {**held, "loss": 0.9}}] * 2,
            "final_checkpoint": str(checkpoint),
        }
        (stage / "spa").mkdir(parents=True)
        (stage / "spa" / "sft_report.json").write_text(json.dumps(report))

    monkeypatch.setattr(lc.subprocess, "run", run_spa)
    monkeypatch.setattr(
        lc, "final_evaluation", lambda run_dir, a, step=None: {} if run_dir == tmp_path / "base" else None
    )
    trained, evaluated = [], []
    monkeypatch.setattr(lc, "train", lambda name, method, seed, run_dir, tasks, a: trained.append(method))
    monkeypatch.setattr(lc, "_eval", lambda run_dir, lock, overrides: evaluated.append(overrides))
    monkeypatch.setattr(lc, "collect_compare", lambda root, a: 0)
    assert lc.compare(args) == 0
    assert len(spa_runs) == 1 and trained == [["preset=empo2", f"model.name={checkpoint}"]] * 2
    assert all(f"model.name={checkpoint}" in o for o in evaluated)
    assert "eval.policy=base" in evaluated[0]  # the warm start alone, then each seed's checkpoint
    policies = [next(x for x in o if x.startswith("eval.policy=")) for o in evaluated]
    assert policies == ["eval.policy=base", "eval.policy=latest", "eval.policy=latest"]
    assert lc.compare(args) == 0 and len(spa_runs) == 1  # done once: stage.json says so
    summary = lc.spa_summary(stage)
    assert summary["epochs"] == 2 and summary["before"]["loss"] == 1.2 and summary["after"]["loss"] == 0.9
    table = lc.compare_table(
        {"design": {"tasks": ["boil"], "variations": 1, "eval_seeds": 1, "training_seeds": [0], "budget_min": 1,
                    "lr": 1e-5}, "policies": {}, "pairs": [], "evaluations": [],
         "training": {"s/seed0": {"learner_steps": 8, "wall_seconds": 60, "episodes": 4, "reflections": 0,
                                  "restarts": {}, "spa": summary}}}
    )  # fmt: skip
    assert "| s/seed0 | " in table and "| 2 | 1.200 → 0.900 | 0.2 → 0.2 (5 predictions) |" in table


def test_the_diagnostics_of_a_run_are_its_step_means_its_tip_turns_and_its_memory(tmp_path, monkeypatch):
    steps = [
        {"record": "step", "zero_advantage_fraction": 1.0, "masked_fraction": 0.5, "entropy_mean": 2.0,
         "episodes_by_mode": {"on_policy": 3, "on_policy_tips": 1}, "env_steps": 20, "tip_turn_fraction": 0.1,
         "tip_samples_trained_fraction": 0.5},
        {"record": "eval", "zero_advantage_fraction": 9.0},  # an evaluation record: not a step
        {"record": "step", "zero_advantage_fraction": 0.0, "masked_fraction": 0.25, "entropy_mean": None,
         "episodes_by_mode": {"off_policy": 2, "on_policy": 2}},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, steps)) + "\n")
    with closing(sqlite3.connect(tmp_path / "memory.sqlite")) as db:
        db.execute(
            "CREATE TABLE entries (id INTEGER PRIMARY KEY, key TEXT, tip TEXT, score REAL, state TEXT, vector BLOB)"
        )
        db.executemany(
            "INSERT INTO entries (key, tip, score) VALUES ('boil/3', ?, ?)",
            [("low", 0.0), ("best", 25.0), ("mid", 8.0), ("worst", -100.0), ("best", 25.0), ("mid", 3.0)],
        )
        good = tip_text("Go outside.", "go to outside", 50.0)
        db.executemany(
            "INSERT INTO entries (key, tip, score) VALUES ('boil/3', ?, ?)",
            [(good, 50.0), (tip_text("Go outside.", "focus on door", 50.0), 50.0)],
        )
        db.commit()
    monkeypatch.setattr(lc, "gold_actions", lambda keys, simplification: dict.fromkeys(keys, {"go to outside"}))
    d = lc.diagnostics(tmp_path)
    assert d["zero_advantage_fraction_mean"] == pytest.approx(0.5) and d["masked_fraction_mean"] == pytest.approx(0.375)
    assert d["entropy_mean_mean"] == pytest.approx(2.0)  # the step without a value left out
    assert "clip_fraction_mean" not in d  # no step has it
    assert d["tip_mode_episodes"] == 3  # on_policy_tips and off_policy episodes, drawn in a tip mode
    assert d["tip_turns"] == 2 and d["tip_turns_trained"] == 0.5  # 10% of step 1's 20 turns showed tips
    assert d["memory_entries"] == 8 and d["distinct_tips"] == 6  # an episode's steps share its reflection
    assert [t["score"] for t in d["tips"]] == [50.0, 50.0, 25.0] and d["tips"][2]["tip"] == "best"  # best first
    # of the 8 tips one names a gold action: 1 of the 2 of episodes that scored >= 50
    assert d["tip_actions"] == {
        "entries": 8,
        "naming_a_gold_action": 1,
        "fraction": 0.125,
        "entries_of_episodes_ge50": 2,
        "fraction_of_episodes_ge50": 0.5,
    }
    assert "weight_change_relative" not in d  # no checkpoint
    # a run that ended before its first step
    assert lc.diagnostics(tmp_path / "nothing") == {
        "tip_mode_episodes": 0,
        "tip_turns": None,
        "tip_turns_trained": None,
    }


def test_weight_change_is_the_relative_norm_of_the_difference(tmp_path):
    save_file({"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0])}, tmp_path / "model.safetensors")
    save_file({"a": torch.tensor([3.0, 1.0]), "b": torch.tensor([4.0])}, tmp_path / "trained.safetensors")
    assert lc.weight_change(tmp_path, tmp_path / "trained.safetensors") == pytest.approx(1 / 5)


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
    args = SimpleNamespace(variations=2, episodes=1, report="learning_check_base")
    assert lc.collect(tmp_path / "run", ["boil", "find-animal", "melt"], [], args) == 0
    result = json.loads((tmp_path / "results" / "learning_check_base.json").read_text())
    assert result["tasks_evaluated"] == 2 and result["tasks_planned"] == 3 and result["complete"] is False
    assert result["tasks_with_signal"] == ["find-animal"]
    assert (
        "| find-animal | 2 x 1 | 12.5 ± – | 0% | 0.00 / 0.00 (k=1) | 0.00 / 0.00 | 12.5 | 100.0 ± 0.0 | 72.4 ± 6.8 |"
        in (tmp_path / "results" / "learning_check_base.md").read_text()
    )


def test_herl_and_sge_runs_report_their_guided_groups_and_strategies(tmp_path):
    steps = [
        {"record": "step", "episodes_by_mode": {"on_policy": 4}, "strategies_per_episode": 4.0,
         "distinct_strategies_per_group": 3.0},
        {"record": "step", "episodes_by_mode": {"on_policy": 4}, "strategies_per_episode": 2.0,
         "distinct_strategies_per_group": None},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, steps)) + "\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "replay_buffer.log").write_text(
        "x INFO replay_buffer: guided group 74fe90f9 closed: 1 of 1 revisions in, best original 25, a copy of the best original in slot 3\n"
        "x INFO replay_buffer: guided group dcc53fa8 closed: 2 of 3 revisions in, best original 17, a revision scoring 25 in slot 1\n"
        "x INFO replay_buffer: guided group 68518fcb closed: 3 of 3 revisions in, best original 25, a revision scoring 25 in slot 0\n"
    )
    out = lc.diagnostics(tmp_path)
    assert out["herl"] == {
        "guided_groups": 3,
        "revisions_played": 6,
        "revisions_inserted": 2,
        "revisions_beating_best": 1,
    }
    assert out["strategies_per_episode_mean"] == 3.0 and out["distinct_strategies_per_group_mean"] == 3.0
    table = lc.compare_table(
        {"design": {"tasks": ["t"], "variations": 1, "eval_seeds": 1, "training_seeds": [0], "budget_min": 1, "lr": 1e-4},
         "policies": {}, "pairs": [], "evaluations": [], "training": {"herl/seed0": {**out, "learner_steps": 2,
         "wall_seconds": 1, "episodes": 8, "reflections": 0, "restarts": {}}}}
    )  # fmt: skip
    assert "| herl/seed0 | 3 | 6 | 2 | 1 |" in table and "| herl/seed0 | 3 | 3 |" in table


def test_the_papers_mask_fraction_is_judged_on_the_sampled_tokens_per_strategy_temperature(tmp_path):
    import numpy as np

    from protocol.codec import encode
    from protocol.messages import Trajectory, TurnRecord
    from replay_buffer.buffer import BufferLog
    from replay_buffer.config import Durability

    def episode(k: int, temperature: float, logprobs: list[list[float]], masks: list[list[int]]) -> Trajectory:
        turns = [
            TurnRecord(np.array([1, 2], np.int32), np.arange(len(lp), dtype=np.int32) + 3, np.array(lp, np.float32),
                       response_mask=np.array(m, np.uint8), strategy="plan")
            for lp, m in zip(logprobs, masks)
        ]  # fmt: skip
        return Trajectory.from_turns(
            turns, episode_id=f"e{k}", group_id="g", slot=k, actor_id="a", task="t", variation=0,
            mode="on_policy", score=0.0, done=False, strategy_temperature=temperature,
        )  # fmt: skip

    log = BufferLog(tmp_path / "buffer.log", Durability.flush)
    # glue (mask 0) at -9 is not judged; a sampled token at -6 is
    log.append_trajectory(encode(episode(0, 0.6, [[-9.0, -1.0], [-6.0, -1.0]], [[0, 1], [1, 1]])))
    log.append_trajectory(encode(episode(1, 1.4, [[-7.0]], [[1]])))
    log.sync()
    assert lc.paper_mask_fractions(tmp_path) == {"0.60": 0.5, "1.40": 1.0}


def test_the_measure_turns_each_episode_into_a_rate_before_any_comparison():
    """--measure ge50 / success: an episode counts 100 or 0, so means, pairs and seed tests are rates in %."""
    episode = {"score": 50.0, "success": False}
    assert [lc.MEASURES[m](episode) for m in ("score", "ge50", "success")] == [50.0, 100.0, 0.0]
    assert lc.MEASURES["ge50"]({"score": 25.0, "success": False}) == 0.0
    assert lc.MEASURES["success"]({"score": 100.0, "success": True}) == 100.0


def test_the_final_evaluation_is_the_last_steps_not_a_periodic_one_of_the_same_design(tmp_path):
    """--eval-every 20 --eval-every-variations 0 scores step_20 on the final design: a run stopped before
    its last step is not evaluated yet, and a finished one's final evaluation is its last step's."""
    run = tmp_path / "run"
    args = SimpleNamespace(variations=2, episodes=2)
    _evaluation(run, {(0, 0): 10.0}, variations=2, seeds=2)
    (run / "eval" / "x").rename(run / "eval" / "step_20")
    assert lc.final_evaluation(run, args, 40) is None  # stopped at step 20..39: train on, then evaluate
    assert lc.final_evaluation(run, args)[1][("boil", 0, 0)]["score"] == 10.0  # no step asked: the newest
    _evaluation(run, {(0, 0): 50.0}, variations=2, seeds=2)
    (run / "eval" / "x").rename(run / "eval" / "step_40")
    assert lc.final_evaluation(run, args, 40)[1][("boil", 0, 0)]["score"] == 50.0
    assert lc.final_evaluation(run, args)[1][("boil", 0, 0)]["score"] == 50.0  # "step_40" < "step_5" as text
    _evaluation(run, {(0, 0): 90.0}, variations=5, seeds=2)  # another design: never the final one
    (run / "eval" / "x").rename(run / "eval" / "step_5")
    assert lc.final_evaluation(run, args)[1][("boil", 0, 0)]["score"] == 50.0
    (run / "eval" / "step_45").mkdir()  # a periodic evaluation its run's end cut short: no results.json
    assert lc.final_evaluation(run, args)[1][("boil", 0, 0)]["score"] == 50.0


def test_compare_trains_seed_by_seed_so_a_stopped_compare_leaves_the_arms_even(tmp_path, monkeypatch):
    args = SimpleNamespace(tasks=["boil"], run_root=str(tmp_path), variations=1, episodes=1, collect=False, steps=0,
                           seeds=[0, 1], presets=["a=grpo", "b=empo2"], lock="", spa=[], overrides=[])  # fmt: skip
    monkeypatch.setattr(lc, "check_design_horizon", lambda a: None)
    monkeypatch.setattr(lc, "final_evaluation", lambda run_dir, a, step=None: None)
    trained = []
    monkeypatch.setattr(lc, "train", lambda name, method, seed, run_dir, tasks, a: trained.append((name, seed)))
    monkeypatch.setattr(lc, "_eval", lambda run_dir, lock, overrides: None)
    monkeypatch.setattr(lc, "collect_compare", lambda root, a: 0)
    assert lc.compare(args) == 0
    assert trained == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
