"""SGE's strategy store (memory_service/strategies.py): the best and the most recent earlier strategies of
a task, one reflection per group kept for all its members and across a restart, a re-sent report stored
once, the task's oldest strategies past the capacity gone."""

from __future__ import annotations

from memory_service.strategies import StrategyStore


def test_a_group_is_shown_the_best_then_the_most_recent_others_and_keeps_it(tmp_path):
    store = StrategyStore(tmp_path / "m.sqlite", capacity=100)
    for k, (strategy, score) in enumerate([("a", 10), ("b", 50), ("c", 0), ("d", 50), ("e", -100), ("f", 5)]):
        assert store.add(f"ep{k}", "boil", k, strategy, score, 1.0)
    assert not store.add("ep0", "boil", 0, "a", 10, 1.0)  # the same episode again: stored once
    store.add("other", "melt", 0, "z", 100, 1.0)  # another task: never shown for boil
    # best 2: the 50s, the newer first; then the 2 most recent others: f, e
    shown = store.reflection("g1", "boil", best=2, recent=2)
    assert shown == [("d", 50), ("b", 50), ("f", 5), ("e", -100)]
    store.add("ep9", "boil", 0, "g", 90, 1.0)  # a better one arrives while g1's members play
    assert store.reflection("g1", "boil", best=2, recent=2) == shown  # every member sees the same
    assert store.reflection("g2", "boil", best=2, recent=2)[0] == ("g", 90)  # the next group sees it
    store.close()
    reopened = StrategyStore(tmp_path / "m.sqlite", capacity=100)
    assert reopened.reflection("g1", "boil", best=2, recent=2) == shown  # across a restart too
    assert reopened.count() == 8


def test_a_strategy_tried_again_is_listed_once_at_its_best_and_the_capacity_bounds_a_task(tmp_path):
    store = StrategyStore(tmp_path / "m.sqlite", capacity=3)
    for k, score in enumerate([5, 40, 7]):
        store.add(f"ep{k}", "boil", 0, "same plan", score, 1.0)
    assert store.reflection("g", "boil", best=2, recent=2) == [("same plan", 40)]
    store.add("ep3", "boil", 0, "new plan", 1, 1.0)
    assert store.count() == 3  # the task's oldest went
    assert store.reflection("h", "unseen-task", best=2, recent=2) == []
