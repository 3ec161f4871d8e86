"""Configuration of the evaluation drivers (test-time adaptation)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TestTimeAdaptationConfig:
    """`empo2-memory-tta`: K trials per unseen task with memory on and no weight updates
    (paper Figure 8). Starts its own policy server(s) and memory service."""

    __test__ = False  # not a pytest test class despite the name

    tasks: list[str] = field(default_factory=lambda: ["find-animal"])  # tasks not trained on
    variations: int = 1  # the first N test variations of each task
    trials: int = 5  # K: attempts per (task, variation); memory grows between them
    temperature: float = 0.4  # evaluation temperature (empo2.md)
    reflection_wait_s: float = 300.0  # wait for each trial's reflection before the next trial
