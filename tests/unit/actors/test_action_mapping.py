"""Generated text -> ScienceWorld action (common/scienceworld.py: clean_action, most_similar_action).

Only the pure functions are imported; the ScienceWorld class (a JVM) is never instantiated.
"""

from __future__ import annotations

import pytest

from common.scienceworld import clean_action, most_similar_action

VALID = ["look around", "open door to kitchen", "go to kitchen", "pick up apple", "pick up banana", "focus on apple"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("look around", "look around"),
        ('"look around"', "look around"),
        ("'look around'", "look around"),
        ("`look around`", "look around"),
        ("> look around", "look around"),
        (">look around", "look around"),
        ("look around.", "look around"),
        ("look around...", "look around"),
        ('"look around."', "look around"),
        ("\n\n   look around\n", "look around"),
        ("go to kitchen\nThen I will look around.", "go to kitchen"),
        ("\n\n> open door to kitchen.\nobservation text", "open door to kitchen"),
        ('""\n.\n  focus on apple', "focus on apple"),  # lines that clean to nothing are skipped
        ("Look Around", "look around"),
        ("  Pick Up Apple.  ", "pick up apple"),
    ],
)
def test_clean_action(text, expected):
    assert clean_action(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "\n\n", '""', "> .", "...\n``"])
def test_clean_action_of_nothing_is_empty(text):
    assert clean_action(text) == ""


def test_clean_action_arrow_then_quotes():
    assert clean_action('> "look around"') == "look around"


def test_exact_valid_action_is_not_mapped():
    assert most_similar_action("pick up banana", VALID) == ("pick up banana", False)


def test_messy_but_exact_action_is_not_mapped():
    assert most_similar_action('  "Pick up apple."\nI think this helps.', VALID) == ("pick up apple", False)


def test_near_miss_maps_to_jaccard_best():
    # query {pick, up, the, apple}: "pick up apple" 3/4 = 0.75, "pick up banana" 2/5 = 0.4,
    # "focus on apple" 1/6
    assert most_similar_action("pick up the apple", VALID) == ("pick up apple", True)


def test_near_miss_on_word_overlap_not_order():
    # query {kitchen, to, go, now}: "go to kitchen" 3/4; "open door to kitchen" 2/6
    assert most_similar_action("now go kitchen to", VALID) == ("go to kitchen", True)


def test_ties_go_to_first_valid_action():
    # query {pick, up}: "pick up apple" 2/3 and "pick up banana" 2/3 tie
    assert most_similar_action("pick up", VALID) == ("pick up apple", True)
    reordered = ["look around", "pick up banana", "pick up apple"]
    assert most_similar_action("pick up", reordered) == ("pick up banana", True)


def test_no_overlap_gives_first_valid_action():
    assert most_similar_action("dance wildly", VALID) == ("look around", True)


@pytest.mark.parametrize("text", ["", "   \n  ", '"".'])
def test_empty_text_maps_to_a_valid_action(text):
    action, mapped = most_similar_action(text, VALID)
    assert action in VALID
    assert action == VALID[0]
    assert mapped is True


def test_valid_action_with_punctuation_words():
    valid = ["look at substance in inventory", "move apple to fridge"]
    # query {move, the, apple, into, fridge}: "move apple to fridge" 3/6 = 0.5 vs 0
    assert most_similar_action("Move the apple into fridge.", valid) == ("move apple to fridge", True)
