"""env.jvm_max_heap_mb caps a ScienceWorld env's JVM heap (issue 26: an env actor's RSS stays
bounded over days): the real JVM reports the cap as its maximum heap."""

from __future__ import annotations

import os

import pytest

from common.config import EnvConfig
from common.scienceworld import ScienceWorld


def _max_heap_mb(world: ScienceWorld) -> float:
    return world.env._gateway.jvm.java.lang.Runtime.getRuntime().maxMemory() / 2**20


@pytest.mark.parametrize("cap_mb", [256])
def test_the_jvm_runs_under_the_configured_heap_cap(cap_mb, monkeypatch):
    monkeypatch.delenv("JAVA_TOOL_OPTIONS", raising=False)
    world = ScienceWorld(EnvConfig().simplification, max_heap_mb=cap_mb)
    java = world.env._gateway.java_process
    try:
        assert os.environ["JAVA_TOOL_OPTIONS"] == f"-Xmx{cap_mb}m"
        assert cap_mb * 0.8 <= _max_heap_mb(world) <= cap_mb  # the JVM may keep a survivor space back
        world.reset("find-living-thing", 0)
        assert "This room is called" in world.step("look around").state  # and it plays
    finally:
        world.close()
        java.wait(timeout=30)  # the JVM stops after close, not at once


def test_a_negative_cap_is_refused_at_load():
    with pytest.raises(ValueError, match="jvm_max_heap_mb"):
        EnvConfig(jvm_max_heap_mb=-1).validate()
