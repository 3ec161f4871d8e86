"""The prompt-cost benchmark's pure logic: the interleaved generation order and the random policy."""

from __future__ import annotations

import json
import random

from benchmarks.prompt_cost import finite, pick_action, schedule


def test_schedule_interleaves_both_variants_turn_by_turn_alternating_which_goes_first():
    order = schedule([2, 3])
    assert order == [
        (0, 0, "a"), (0, 0, "b"),
        (0, 1, "b"), (0, 1, "a"),
        (1, 0, "a"), (1, 0, "b"),
        (1, 1, "b"), (1, 1, "a"),
        (1, 2, "a"), (1, 2, "b"),
    ]  # fmt: skip


def test_schedule_issues_every_turn_once_per_variant_in_episode_order():
    lengths = [4, 1, 12]
    order = schedule(lengths)
    for v in "ab":
        mine = [(e, t) for e, t, w in order if w == v]
        assert mine == [(e, t) for e, n in enumerate(lengths) for t in range(n)]


def test_random_policy_avoids_focus_while_another_action_is_valid():
    rng = random.Random(0)
    valid = ["focus on apple", "look around", "focus on door", "open door"]
    assert {pick_action(rng, valid) for _ in range(50)} == {"look around", "open door"}
    assert pick_action(rng, ["focus on apple"]) == "focus on apple"


def test_results_are_strict_json_without_nan():
    value = finite({"a": float("nan"), "b": [1.0, float("nan")], "c": (2, "x")})
    assert value == {"a": None, "b": [1.0, None], "c": [2, "x"]}
    json.dumps(value, allow_nan=False)
