"""The commands (pyproject [project.scripts], and `python -m pipeline <command>`): each loads and
validates the configuration before it imports its role (torch, vLLM), so `--help` and a bad value
answer in about a second, then calls the role's main with what the role table (pipeline/roles.py)
says it is given.

    empo2-<role> --help          the role's docstring (sockets, Run line) and the config it is given
    empo2-<role> key=value ...   a refused value: one line naming the key and the choices, exit 2
    empo2-config [key=value ...] the resolved configuration (profile and overrides applied), YAML
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from common.config import RunFacts
from common.heartbeat import heartbeat_path
from common.process import lower_cpu_priority
from pipeline.config import CONF_DIR, ConfigError, PipelineConfig, load_config, run_facts, to_yaml
from pipeline.roles import LEARNER_TOKEN_ENV, ROLES, Role, process_index, process_name, visible_gpus

# what every role is given beside its own sections (RunFacts), shown by its --help
_SHARED = ("run_dir", "seed", "startup_timeout_s", "model", "endpoints", "metrics", "security")
# a driver's own section, shown by its --help (it is given the whole configuration)
_DRIVER_SECTIONS = {
    "empo2-run": ("launch",),
    "empo2-eval": ("eval", "env"),
    "empo2-memory-tta": ("tta", "env"),
    "empo2-spa": ("spa", "env"),
    "empo2-evaluator": ("eval",),
}
_HELP_FLAGS = ("-h", "--help")


def role_config(command: str, argv: list[str] | None = None) -> PipelineConfig:
    """The validated configuration of `command` from `key=value` arguments (sys.argv[1:] by
    default). --help prints the command's help and exits 0; a refused configuration prints one
    line on stderr and exits 2, before anything starts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in _HELP_FLAGS for a in argv):
        print(help_text(command, [a for a in argv if a not in _HELP_FLAGS]))
        sys.exit(0)
    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        print(f"{command}: bad configuration: {exc}", file=sys.stderr)
        sys.exit(2)
    if not cfg.security.learner_token:  # the one empo2-run made for this run, if it started us
        cfg.security.learner_token = os.environ.get(LEARNER_TOKEN_ENV, "")
    use_security(command, cfg)
    return cfg


def use_security(command: str, cfg: PipelineConfig) -> None:
    """security.curve: every socket of this process uses CURVE with the command's keys. Missing keys
    stop the command here, with the empo2-keys command to run (exit 2)."""
    from protocol.security import Curve, use_curve

    curve = Curve(Path(cfg.security.keys_dir), ROLES[command].curve_client) if cfg.security.curve else None
    try:
        use_curve(curve)
    except RuntimeError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        sys.exit(2)


def help_sections(command: str) -> tuple[str, ...]:
    """The sections `command --help` shows: what a role is given; a driver's own."""
    role = ROLES[command]
    return _DRIVER_SECTIONS.get(command, ()) if role.driver else role.sections


def help_text(command: str, overrides: list[str]) -> str:
    role = ROLES[command]
    doc = module_docstring(role.module) or ""
    shown = help_sections(command)
    given = (
        "It drives roles and reads the whole configuration (`empo2-config` prints it); its own sections"
        if role.driver
        else f"It is given these sections and the run's facts ({', '.join(_SHARED)}; common.config.RunFacts)"
    )
    try:
        values = to_yaml(load_config(overrides), (*shown, *_SHARED)).rstrip()
    except ConfigError as exc:
        values = f"(not shown: {exc})"
    return (
        f"{command}: {doc.strip()}\n\n"
        f"{given}, with the values a run would use (dataclass defaults, preset, profile and these\n"
        "overrides); override any key as key=value, e.g. profile=paper.\n\n"
        f"{values}"
    )


def module_docstring(module: str) -> str | None:
    """A module's docstring, read from its source without importing it (no torch, no vLLM)."""
    origin = importlib.util.find_spec(module).origin
    return ast.get_docstring(ast.parse(Path(origin).read_text()))


def run(command: str, argv: list[str] | None = None) -> int | None:
    """Load the configuration for `command` and run its module: a role's main with its sections and
    the run's facts, a driver's with the whole configuration."""
    argv = list(sys.argv[1:] if argv is None else argv)
    role = ROLES[command]
    flagged = dict(role.flags).get(argv[0]) if argv else None
    if flagged:  # e.g. empo2-run --attach: no run configuration of its own
        return getattr(importlib.import_module(role.module), flagged)(argv[1:])
    stage = argv[:1] if role.stages and argv[:1] and argv[0] in role.stages else []
    argv = argv[len(stage) :]
    cfg = role_config(command, argv)  # a bad value is refused first, stage or not
    if role.stages and not stage:
        print(f"usage: {command} {{{'|'.join(role.stages)}}} [key=value ...]", file=sys.stderr)
        return 2
    if role.rollout:  # before the import: vLLM's and torch's threads inherit it
        lower_cpu_priority(cfg.pipeline.rollout_nice)
    gpus = visible_gpus(command, cfg)
    if gpus:  # before the import: CUDA reads it once; set here, every launch path (launcher, systemd, Slurm) has it
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus
    module = importlib.import_module(role.module)
    if role.driver:
        return module.main([*stage, *argv], cfg)
    return module.main(**given(command, cfg))


def given(command: str, cfg: PipelineConfig) -> dict:
    """What a role's main (and its process object) is given: its sections by name, and `run`."""
    role = ROLES[command]
    return {**{name: getattr(cfg, name) for name in role.sections}, "run": role_facts(role, cfg)}


def role_facts(role: Role, cfg: PipelineConfig) -> RunFacts:
    """The run's facts for one process of `role`, with its metrics port and its heartbeat file
    (<run_dir>/heartbeats/<its name>, what the launcher watches); a process past its kind's port
    range stops here (exit 2)."""
    index = process_index(role, cfg)
    try:
        port = cfg.metrics.port(role.metrics, index) if role.metrics else 0
    except ConfigError as exc:
        print(f"{role.command}: bad configuration: {exc}", file=sys.stderr)
        sys.exit(2)
    return run_facts(cfg, port, str(heartbeat_path(cfg.run_dir, process_name(role, index))))


def main(argv: list[str] | None = None) -> None:
    """`python -m pipeline <command> [key=value ...]`: how the launcher starts its children and
    torchrun the learner's ranks, the same as the command's console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ROLES:
        print(f"usage: python -m pipeline COMMAND [key=value ...]; COMMAND one of {', '.join(ROLES)}", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(argv[0], argv[1:]))


def _entry(command: str):
    """A console script (pyproject [project.scripts]) that runs `command`."""
    return lambda: sys.exit(run(command))


launch = _entry("empo2-run")
policy_server = _entry("empo2-policy-server")
env_actor = _entry("empo2-env-actor")
memory_service = _entry("empo2-memory-service")
replay_buffer = _entry("empo2-replay-buffer")
learner = _entry("empo2-learner")
memory_tta = _entry("empo2-memory-tta")
evaluate = _entry("empo2-eval")
spa = _entry("empo2-spa")


def conf_choices(group: str) -> list[str]:
    """The choices of a config group, read from conf/<group>/ (what Hydra accepts), sorted."""
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def show_config(argv: list[str] | None = None) -> int:
    """empo2-config: print the resolved configuration as YAML (exit 2 if it is refused)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in _HELP_FLAGS for a in argv):
        print(
            "usage: empo2-config [key=value ...]\n\n"
            "Prints the configuration a run with these overrides would use, as YAML: the dataclass\n"
            "defaults (the paper's recipe), the preset, the profile and the overrides, validated as\n"
            "empo2-run does.\n\n"
            f"  preset={'|'.join(conf_choices('preset'))}   the method (conf/preset/; empo2 by default)\n"
            f"  profile={'|'.join(conf_choices('profile'))}   the scale (conf/profile/; cpu by default)"
        )
        return 0
    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        print(f"empo2-config: bad configuration: {exc}", file=sys.stderr)
        return 2
    print(to_yaml(cfg), end="")
    return 0


def config_main() -> None:
    sys.exit(show_config())
