"""Configuration of the evaluation drivers (test-time adaptation)."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.config import at_least, check, positive, scienceworld_tasks, within

# the policy servers an evaluation or a test-time adaptation starts serve fixed weights: they do not
# wait for the newest version of the training run whose directory they share (protocol/newest_version.py)
FIXED_WEIGHTS = ["policy_server.await_newest_version=false"]


@dataclass
class TestTimeAdaptationConfig:
    """`empo2-memory-tta`: K trials per unseen task with memory on and no weight updates
    (paper Figure 8). Starts its own policy server(s) and memory service."""

    __test__ = False  # not a pytest test class despite the name

    tasks: list[str] = field(default_factory=lambda: ["find-animal"])  # tasks not trained on
    variations: int = 1  # the first N test variations of each task
    trials: int = 5  # K: attempts per (task, variation); memory grows between them
    temperature: float = 0.4  # evaluation temperature (docs/method.md)
    reflection_wait_s: float = 300.0  # wait for each trial's reflection before the next trial

    def validate(self) -> None:
        check(bool(self.tasks), "tasks", "needs at least one task")
        scienceworld_tasks("tasks", self.tasks)
        at_least("variations", self.variations, 1)
        at_least("trials", self.trials, 1)
        at_least("temperature", self.temperature, 0)


@dataclass
class EvalConfig:
    """`empo2-eval`: a policy scored as the paper's Table 1 is (docs/method.md, "Reference experimental
    setup"): the first `variations` test variations of each task, `episodes` episodes each, no
    memory, at `temperature`, with the per-task step limits of `env`."""

    # what is scored: "base" (model.name), "latest" (the newest checkpoint in <run_dir>/checkpoints),
    # or a checkpoint directory
    policy: str = "base"
    tasks: list[str] = field(default_factory=list)  # [] = replay_buffer.tasks (the trained ones)
    variations: int = 20  # the first N test variations of each task (never a train variation)
    episodes: int = 4  # episodes per variation, seeds 0..N-1 (the reference harness: 4)
    # Pass@k's second criterion, beside success: an episode passes at this score or above (a small model
    # rarely solves a task; progress is what moves first)
    pass_score: float = 50.0
    temperature: float = 0.4  # the paper's evaluation temperature
    envs: int = 2  # ScienceWorld envs (one JVM and one thread each) played in parallel
    # reuse the policy servers of endpoints.policy_servers instead of starting one (they must serve
    # the policy being scored)
    reuse_servers: bool = False
    # during training: every N learner steps the same evaluation, on subset_tasks x subset_variations,
    # runs as its own process against the newest checkpoint (0 = never)
    every_steps: int = 0
    subset_tasks: list[str] = field(default_factory=list)  # [] = tasks
    subset_variations: int = 2  # test variations each periodic evaluation plays
    # the periodic evaluation's own policy server (it serves the checkpoint, beside the training's) and
    # its metrics block (metrics.base_port's layout, METRICS_PORTS, moved here so no port is shared)
    server_endpoint: str = "tcp://127.0.0.1:5580"
    metrics_base_port: int = 10100  # the periodic evaluation's metrics block (its own, as metrics.base_port's)
    checkpoint_poll_s: float = 10.0  # how often the periodic evaluation looks for a new checkpoint

    def validate(self) -> None:
        check(bool(self.policy), "policy", "base, latest or a checkpoint directory")
        scienceworld_tasks("tasks", self.tasks)
        scienceworld_tasks("subset_tasks", self.subset_tasks)
        at_least("variations", self.variations, 1)
        at_least("episodes", self.episodes, 1)
        within("pass_score", self.pass_score, -100.0, 100.0)
        at_least("temperature", self.temperature, 0)
        at_least("envs", self.envs, 1)
        at_least("every_steps", self.every_steps, 0)
        at_least("subset_variations", self.subset_variations, 1)
        if self.every_steps:
            positive("checkpoint_poll_s", self.checkpoint_poll_s)
