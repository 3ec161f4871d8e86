"""The role table: every command of the project, the module that runs it, what its main is given,
and how a run's launcher starts it. The one place that says which processes a run consists of.

A role's main is given the sections it names here and the run's facts (common.config.RunFacts):
`main(<section>=..., ..., run=RunFacts)`; a driver (the launcher, the evaluations) composes roles
and is given the whole configuration: `main(argv, cfg)`. Every command runs as
`python -m pipeline <command> [key=value ...]` (common.process.spawn_command), which is how the
launcher starts its children and torchrun the learner's ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

from pipeline.config import PipelineConfig


@dataclass(frozen=True)
class Role:
    command: str  # the console script (pyproject [project.scripts]) or a launcher-only command
    module: str  # its main; its docstring is the command's --help
    sections: tuple[str, ...]  # the config sections its main is given; () for a driver, given it all
    metrics: str | None = None  # its METRICS_PORTS kind (common/config.py); None: no /metrics of its own
    index_key: str = ""  # the key numbering its processes (policy_server.index), RANK (torchrun), "" (one)
    # security.curve: the client key its sockets use (protocol/security.py, CLIENT_NAMES); None: it only
    # serves (policy server, replay buffer) or opens no socket (launcher)
    curve_client: str | None = None
    learner_token: bool = False  # given the run's learner token (LEARNER_TOKEN_ENV): it checks or sends it
    console_script: bool = True  # an empo2-* script (pyproject [project.scripts]); else only `python -m pipeline`
    stages: tuple[str, ...] = ()  # a driver whose first argument names what it does (empo2-spa collect ...)
    rollout: bool = False  # on the rollout side: runs at pipeline.rollout_nice (common/process.py lower_cpu_priority)
    # a first argument that runs another function of `module` on the rest, without a run configuration
    # (empo2-run --attach RUN_DIR ...: it talks to a running launcher, whose configuration is its own)
    flags: tuple[tuple[str, str], ...] = ()

    @property
    def driver(self) -> bool:
        return not self.sections


_ROLES = (
    # the roles: given their sections and the run's facts
    Role(
        "empo2-policy-server",
        "actors.policy_server.server",
        sections=("policy_server", "weight_sync"),
        metrics="policy_server",
        index_key="policy_server.index",
        rollout=True,
    ),
    Role(
        "empo2-env-actor",
        "actors.env_actor.process",
        sections=("env_actor", "env", "sge"),
        metrics="env_actor",
        index_key="env_actor.index",
        curve_client="env_actor",
        rollout=True,
    ),
    Role(
        "empo2-memory-service",
        "memory_service.service",
        sections=("memory_service", "sge"),
        metrics="memory_service",
        curve_client="memory_service",
        rollout=True,
    ),
    Role(
        "empo2-replay-buffer",
        "replay_buffer.service",
        sections=("replay_buffer", "env", "herl", "sge"),
        metrics="replay_buffer",
        learner_token=True,
    ),
    Role(
        "empo2-learner",
        "learner.train",
        sections=("learner", "weight_sync", "herl"),
        metrics="learner",
        index_key="RANK",  # under torchrun, rank r serves its metrics on the learner's port + r
        curve_client="learner",
        learner_token=True,
    ),
    # the drivers: given the whole configuration
    Role("empo2-run", "deploy.launch", sections=(), flags=(("--attach", "attach_main"),)),
    Role("empo2-eval", "evaluation.eval", sections=(), curve_client="evaluation"),
    Role("empo2-memory-tta", "evaluation.tta", sections=(), curve_client="evaluation"),
    Role("empo2-spa", "spa.main", sections=(), curve_client="evaluation", stages=("collect", "sft", "all")),
    # eval.every_steps: the periodic evaluation, started by the launcher; it runs empo2-eval per checkpoint
    Role(
        "empo2-evaluator",
        "evaluation.periodic",
        sections=(),
        metrics="evaluator",
        curve_client="evaluation",
        console_script=False,
    ),
)
ROLES = {role.command: role for role in _ROLES}
# With security.learner_token empty, empo2-run makes a random one per run and hands it to the roles
# with learner_token in this variable (not on the command line, which `ps` shows every local user),
# so only its learner takes batches even without CURVE.
LEARNER_TOKEN_ENV = "EMPO2_LEARNER_TOKEN"


class RoleSpec(NamedTuple):
    """One process the launcher starts and supervises (deploy/launch.py); a run's: run_roles."""

    name: str  # unique in a run: its log file, its state entry, the `role` label of its metrics
    argv: list[str]  # `python -m` this (["pipeline", "empo2-learner"]); the run's overrides follow, then `args`
    kind: str  # METRICS_PORTS key: its metrics port is metrics.port(kind, index)
    index: int  # of its kind: policy_server.index, env_actor.index (0 for the single roles)
    ends_run: bool = False  # its exit 0 ends the run (the learner); any other exit is restarted
    args: tuple[str, ...] = ()  # its own overrides, after the run's (so they win)
    learner_token: bool = False  # it is given the run's learner token (LEARNER_TOKEN_ENV)
    # it beats <run_dir>/heartbeats/<name> (common/heartbeat.py): the launcher restarts it when the file
    # stays still for launch.hang_timeout_s (a role does; a driver, the evaluator, does not)
    heartbeat: bool = False


def visible_gpus(command: str, cfg: PipelineConfig) -> str:
    """The CUDA_VISIBLE_DEVICES the configuration gives `command`'s process ("" = leave the host's):
    policy server i's policy_server.gpus[i], the learner's learner.gpus (all its torchrun ranks)."""
    ids = []
    if command == "empo2-policy-server" and cfg.policy_server.gpus:
        ids = cfg.policy_server.gpus[cfg.policy_server.index]
    elif command == "empo2-learner":
        ids = cfg.learner.gpus
    return ",".join(map(str, ids))


def process_index(role: Role, cfg: PipelineConfig) -> int:
    """Which of its kind this process is: its index key's value, or its torchrun rank."""
    if role.index_key == "RANK":
        return int(os.environ.get("RANK", 0))
    if role.index_key:
        section, key = role.index_key.split(".")
        return getattr(getattr(cfg, section), key)
    return 0


def process_name(role: Role, index: int = 0) -> str:
    """A process's name in a run (its RoleSpec.name: log file, state entry, `role` label, heartbeat
    file): the kind, numbered when the role has several (policy_server0, env_actor1); a learner's
    torchrun rank r > 0 is learner.rank<r>."""
    kind = role.metrics or role.command
    if role.index_key == "RANK":
        return kind if index == 0 else f"{kind}.rank{index}"
    return f"{kind}{index}" if role.index_key else kind


def command_spec(command: str, index: int = 0, ends_run: bool = False) -> RoleSpec:
    role = ROLES[command]
    args = (f"{role.index_key}={index}",) if role.index_key and role.index_key != "RANK" else ()
    name = process_name(role, index)
    return RoleSpec(
        name, ["pipeline", command], role.metrics or name, index, ends_run, args, role.learner_token, not role.driver
    )


def env_actor_spec(j: int) -> RoleSpec:
    return command_spec("empo2-env-actor", j)


def run_roles(cfg: PipelineConfig) -> list[RoleSpec]:
    """The processes of a run, in start order: servers first, learner last."""
    specs = [command_spec("empo2-policy-server", i) for i in range(len(cfg.endpoints.policy_servers))]
    specs += [command_spec("empo2-memory-service"), command_spec("empo2-replay-buffer")]
    specs += [env_actor_spec(j) for j in range(cfg.launch.num_env_actors)]
    # eval.every_steps: the periodic evaluation, its own process (never in the learner's way)
    specs += [command_spec("empo2-evaluator")] if cfg.eval.every_steps else []
    learner = command_spec("empo2-learner", ends_run=True)
    if cfg.launch.learner_ranks > 1:  # torchrun starts the ranks and stops them with itself
        ranks = ["torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.launch.learner_ranks}", "-m"]
        learner = learner._replace(argv=[*ranks, *learner.argv])
    return [*specs, learner]
