"""A learning design's horizon against ScienceWorld's gold paths (benchmarks/gold_lengths.py and the
learning check's refusal): an episode shorter than a gold path of a variation it plays measures the
horizon, not the policy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import benchmarks.learning_check as lc
from benchmarks.gold_lengths import horizon_shortfall

LENGTHS = {"train": {0: 6, 1: 10}, "test": {0: 16, 3: None}}


def test_the_shortfall_names_each_variation_the_horizon_cannot_solve():
    assert horizon_shortfall(16, {"train": {0: 6, 1: 10}, "test": {0: 16}}) == []
    assert horizon_shortfall(17, {"train": {0: 6}, "test": {0: 16}}, slack=2) == [
        "test variation 0: gold path 16 actions + slack 2 > 17 steps"
    ]
    short = horizon_shortfall(8, LENGTHS)
    assert short == [
        "train variation 1: gold path 10 actions + slack 0 > 8 steps",
        "test variation 0: gold path 16 actions + slack 0 > 8 steps",
        "test variation 3: ScienceWorld has no gold path for it",
    ]


def test_the_learning_check_refuses_a_design_shorter_than_a_gold_path(monkeypatch, capsys):
    monkeypatch.setattr(lc, "gold_lengths_of", lambda task, train, test: {"train": {0: 6}, "test": {0: 10}})
    args = SimpleNamespace(presets=["empo2", "grpo"], tasks=["find-plant"], slack=2, variations=1)
    args.overrides = ["profile=cpu_learn", "env.max_steps=11"]  # 10 + 2 > 11
    with pytest.raises(SystemExit) as refused:
        lc.check_design_horizon(args)
    assert refused.value.code == 2
    assert "find-plant test variation 0: gold path 10 actions + slack 2 > 11 steps" in capsys.readouterr().err
    args.overrides = ["profile=cpu_learn", "env.max_steps=12"]
    lc.check_design_horizon(args)  # admitted


def test_the_learning_profile_admits_every_gold_path_of_its_design():
    """The committed gold lengths (benchmarks/results/gold_lengths.json) against profile=cpu_learn: the
    first 5 training and 5 test variations of its task, 2 steps to spare (learning_check's defaults)."""
    args = SimpleNamespace(presets=["empo2", "grpo"], slack=2, variations=5, overrides=["profile=cpu_learn"])
    args.tasks = lc.load_config(["profile=cpu_learn"]).replay_buffer.tasks
    lc.check_design_horizon(args)
    args.overrides = ["profile=cpu_learn", "env.max_steps=4"]  # the `cpu` profile's horizon
    with pytest.raises(SystemExit):
        lc.check_design_horizon(args)


def test_the_learning_profile_leaves_the_method_to_the_preset_and_one_mask_rule_to_every_arm():
    """A profile is composed after the preset: one that set p_memory would give preset=grpo a memory."""
    grpo = lc.load_config(["profile=cpu_learn", "preset=grpo"])
    empo2 = lc.load_config(["profile=cpu_learn", "preset=empo2", "replay_buffer.p_memory=0.5"])
    assert grpo.replay_buffer.p_memory == 0.0 and empo2.replay_buffer.p_memory == 0.5
    assert grpo.learner.low_prob_mask == empo2.learner.low_prob_mask == "off"
    assert grpo.env.step_limit("lifespan-longest-lived") == empo2.env.step_limit("lifespan-longest-lived") == 12
