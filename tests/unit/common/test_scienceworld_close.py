"""common/scienceworld.py closes its JVM once (issue 26: a clean stop is clean): ScienceWorldEnv's
own __del__ closes again, and py4j fails a second shutdown with two tracebacks in the role's log
(`Gateway is not connected`, `'NoneType' object has no attribute 'join'`). No JVM: a stand-in env
that fails its second close as py4j does."""

from __future__ import annotations

import gc
import logging

from common.scienceworld import ScienceWorld


class _Env:
    """ScienceWorldEnv's close and __del__, with py4j's second shutdown as an error."""

    def __init__(self, closes: list[str]):
        self.closes = closes

    def close(self) -> None:
        self.closes.append("close")
        if len(self.closes) > 1:
            raise AttributeError("'NoneType' object has no attribute 'join'")

    def __del__(self):
        self.close()


def _world(closes: list[str]) -> ScienceWorld:
    world = ScienceWorld.__new__(ScienceWorld)  # no JVM
    world.env, world.closed, world.simplification, world.task_description = _Env(closes), False, "easy", ""
    return world


def test_the_jvm_is_closed_once_whoever_closes_it_again(recwarn):
    closes: list[str] = []
    world = _world(closes)
    world.close()
    world.close()  # a worker's close after the episode runner's
    del world
    gc.collect()  # ScienceWorldEnv.__del__: the env's close again
    assert closes == ["close"]
    assert not [w for w in recwarn if "unraisable" in str(w.category).lower()]


def test_py4j_logs_only_warnings_and_errors():
    """py4j's INFO lines (its callback server starting and stopping, a shutdown that finds the JVM
    already gone, each with a traceback) stay out of the roles' logs."""
    assert logging.getLogger("py4j").getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("py4j.java_gateway").isEnabledFor(logging.WARNING)
    assert not logging.getLogger("py4j.java_gateway").isEnabledFor(logging.INFO)
