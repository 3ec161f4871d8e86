"""HeRL's group rules by hand (replay_buffer/hindsight.py): the trigger, the candidates, the insertion."""

from __future__ import annotations

import random

from replay_buffer.hindsight import Insertion, hindsight_candidates, insertion


def test_a_solved_group_triggers_nothing_and_an_unsolved_one_every_tied_best_member():
    assert hindsight_candidates([100.0, 40.0, 8.0, 40.0], max_candidates=16) == []
    assert hindsight_candidates([40.0, 8.0, 40.0, -100.0], max_candidates=16) == [0, 2]
    assert hindsight_candidates([17.0] * 20, max_candidates=16) == list(range(16))  # capped
    assert hindsight_candidates([8.0, 17.0, 8.0], max_candidates=1) == [1]


def test_a_strictly_better_revision_wins_else_an_equal_one_else_a_copy_not_marked():
    rng = random.Random(0)
    better = insertion([40.0, 8.0, 40.0, 0.0], [40.0, 65.0, 50.0], rng)
    assert better.revision == 1 and better.hindsight and 0 <= better.slot < 4  # the best of the better ones
    equal = insertion([40.0, 8.0, 40.0, 0.0], [8.0, 40.0], rng)
    assert equal.revision == 1 and equal.hindsight
    worse = insertion([40.0, 8.0, 40.0, 0.0], [8.0, -100.0], rng)
    assert worse.revision is None and not worse.hindsight
    slots = {insertion([1.0, 2.0, 3.0], [], random.Random(s)).slot for s in range(50)}
    assert slots == {0, 1, 2}  # one random slot of the group, any of them
    assert insertion([1.0], [], random.Random(1)) == Insertion(0, None, False)
