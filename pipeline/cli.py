"""The commands (pyproject [project.scripts]): each loads and validates the configuration before
it imports its role (torch, vLLM), so `--help` and a bad value answer in about a second.

    empo2-<role> --help          the role's docstring (sockets, Run line) and the config it reads
    empo2-<role> key=value ...   a refused value: one line naming the key and the choices, exit 2
    empo2-config [key=value ...] the resolved configuration (profile and overrides applied), YAML

`python -m <role module>` (how the launcher starts its children, and torchrun the learner) goes
through the same role_config in the module's main.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import ConfigError, PipelineConfig, load_config, to_yaml

_SHARED = ("run_dir", "seed", "model", "endpoints", "metrics")


@dataclass(frozen=True)
class Command:
    module: str  # runs it (`main(argv, cfg)`); its docstring is the command's help
    sections: tuple[str, ...]  # the configuration it reads, shown by --help


COMMANDS = {
    "empo2-run": Command("deploy.launch", ("launch", *_SHARED)),
    "empo2-policy-server": Command("actors.policy_server.server", ("policy_server", "weight_sync", *_SHARED)),
    "empo2-env-actor": Command("actors.env_actor.process", ("env_actor", "env", "startup_timeout_s", *_SHARED)),
    "empo2-memory-service": Command("memory_service.service", ("memory_service", *_SHARED)),
    "empo2-replay-buffer": Command("replay_buffer.service", ("replay_buffer", "env", "pipeline", *_SHARED)),
    "empo2-learner": Command("learner.train", ("learner", "weight_sync", "startup_timeout_s", *_SHARED)),
    "empo2-memory-tta": Command("evaluation.tta", ("tta", "env", "startup_timeout_s", *_SHARED)),
    "empo2-eval": Command("evaluation.eval", ("eval", "env", "startup_timeout_s", *_SHARED)),
}
_HELP_FLAGS = ("-h", "--help")
# With security.learner_token empty, empo2-run makes a random one per run and hands it to the replay
# buffer and the learner it starts in this variable (not on the command line, which `ps` shows
# every local user), so only its learner takes batches even without CURVE (deploy/launch.py).
LEARNER_TOKEN_ENV = "EMPO2_LEARNER_TOKEN"
# security.curve: the client key (protocol/security.py, CLIENT_NAMES) each command's sockets use;
# a command not listed only serves (policy server, replay buffer) or opens no socket (launcher).
CURVE_CLIENTS = {
    "empo2-learner": "learner",
    "empo2-env-actor": "env_actor",
    "empo2-memory-service": "memory_service",
    "empo2-memory-tta": "evaluation",
    "empo2-eval": "evaluation",  # and the periodic evaluator (evaluation/periodic.py), which runs as it
}


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

    curve = Curve(Path(cfg.security.keys_dir), CURVE_CLIENTS.get(command)) if cfg.security.curve else None
    try:
        use_curve(curve)
    except RuntimeError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        sys.exit(2)


def help_text(command: str, overrides: list[str]) -> str:
    spec = COMMANDS[command]
    doc = module_docstring(spec.module) or ""
    try:
        values = to_yaml(load_config(overrides), spec.sections).rstrip()
    except ConfigError as exc:
        values = f"(not shown: {exc})"
    return (
        f"{command}: {doc.strip()}\n\n"
        "Configuration it reads, with the values a run would use (dataclass defaults, preset, profile and\n"
        "these overrides); override any key as key=value, e.g. profile=paper. `empo2-config` prints all.\n\n"
        f"{values}"
    )


def module_docstring(module: str) -> str | None:
    """A module's docstring, read from its source without importing it (no torch, no vLLM)."""
    origin = importlib.util.find_spec(module).origin
    return ast.get_docstring(ast.parse(Path(origin).read_text()))


def _run(command: str) -> None:
    argv = sys.argv[1:]
    cfg = role_config(command, argv)
    module = importlib.import_module(COMMANDS[command].module)
    sys.exit(module.main(argv, cfg))


def launch() -> None:
    if sys.argv[1:2] == ["--attach"]:  # scale a running pipeline: the launcher's main reads the arguments
        sys.exit(importlib.import_module(COMMANDS["empo2-run"].module).main(sys.argv[1:]))
    _run("empo2-run")


def policy_server() -> None:
    _run("empo2-policy-server")


def env_actor() -> None:
    _run("empo2-env-actor")


def memory_service() -> None:
    _run("empo2-memory-service")


def replay_buffer() -> None:
    _run("empo2-replay-buffer")


def learner() -> None:
    _run("empo2-learner")


def memory_tta() -> None:
    _run("empo2-memory-tta")


def evaluate() -> None:
    _run("empo2-eval")


def show_config(argv: list[str] | None = None) -> int:
    """empo2-config: print the resolved configuration as YAML (exit 2 if it is refused)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in _HELP_FLAGS for a in argv):
        print(
            "usage: empo2-config [key=value ...]\n\n"
            "Prints the configuration a run with these overrides would use, as YAML: the dataclass\n"
            "defaults (the paper's recipe), the preset (preset=empo2|grpo|gigpo|rnd), the profile\n"
            "(profile=cpu, the default, |paper|e2e) and the overrides, validated as empo2-run does."
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
