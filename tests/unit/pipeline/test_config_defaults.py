"""One source of defaults: the dataclasses. conf/pipeline.yaml and the presets restate none of
them, the profiles change only what they name, and no library signature repeats (or contradicts)
a config value as a default of its own."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
import yaml

from pipeline.config import CONF_DIR, PipelineConfig, load_config

CONF = Path(CONF_DIR)


MAP_FIELDS = ("max_steps_per_task",)  # dict-valued keys: one value each


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key not in MAP_FIELDS:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _values(cfg: PipelineConfig) -> dict:
    """Every key of a config as a flat dict, choices as their plain values."""
    return {k: v.value if hasattr(v, "value") else v for k, v in _flat(dataclasses.asdict(cfg)).items()}


def _yaml_keys(path: Path) -> dict:
    tree = yaml.safe_load(path.read_text()) or {}
    tree.pop("defaults", None)
    return _flat(tree)


DEFAULTS = _values(PipelineConfig())


def test_pipeline_yaml_and_preset_empo2_are_the_dataclass_defaults():
    cfg = load_config(["~profile"])  # conf/pipeline.yaml + preset empo2, no profile
    assert _values(cfg) == {**DEFAULTS, "run_dir": cfg.run_dir}
    assert set(_yaml_keys(CONF / "pipeline.yaml")) == {"run_dir"}  # it composes; it restates nothing
    assert _yaml_keys(CONF / "preset" / "empo2.yaml") == {}


@pytest.mark.parametrize("preset", ["grpo", "gigpo", "rnd", "herl", "empo2_herl"])
def test_a_preset_changes_only_what_it_names_and_restates_no_default(preset):
    named = _yaml_keys(CONF / "preset" / f"{preset}.yaml")
    changed = {k: v for k, v in _values(load_config(["~profile", f"preset={preset}"])).items() if DEFAULTS[k] != v}
    changed.pop("run_dir")
    assert changed == named
    assert named  # and each of them differs from its default (the comparison above drops equal ones)


# What `make run` ran before the defaults moved into the dataclasses (conf/pipeline.yaml at the
# time): the CPU profile must keep it exactly (renamed keys aside: env_actor.max_steps -> env.max_steps).
CPU_RUN = {
    "env.max_steps": 4,
    "env.task_step_limits": False,  # 4 steps for every task, also those with a reference limit
    "pipeline.rollout_nice": 10,  # the learner first on the shared cores (benchmarks/README.md#async-vs-sync)
    "replay_buffer.tasks": ["find-living-thing"],
    "replay_buffer.group_size": 4,
    "replay_buffer.max_open_groups": 1,
    "replay_buffer.max_ready_groups": 1,
    "learner.total_steps": 2,
    "learner.groups_per_step": 1,
    "learner.mini_batch_samples": 0,  # one optimizer step per batch, as then (the paper: mini-batches of 128)
    "learner.low_prob_mask": "tip_rollouts",  # the paper's rule would mask 96% of the small model's samples
    "spa.episodes": 24,  # SPA's warm start at a CPU scale (the paper: 1280 episodes, 400-token turns, 5 epochs)
    "spa.max_turn_tokens": 160,
    "spa.epochs": 2,
    "spa.malformed": "rebuild",  # the embedded model does not follow the world-model format
}


def test_the_cpu_profile_is_the_default_and_keeps_the_small_run():
    cfg = load_config([])
    values = _values(cfg)
    assert {k: values[k] for k in CPU_RUN} == CPU_RUN
    changed = {k for k, v in values.items() if DEFAULTS[k] != v} - {"run_dir"}
    assert changed <= set(CPU_RUN) and set(_yaml_keys(CONF / "profile" / "cpu.yaml")) == set(CPU_RUN)
    assert cfg.run_dir.startswith("runs/") and cfg.run_dir != "runs/default"  # a new directory per run


def test_the_e2e_profile_is_the_cpu_profile_plus_its_own_keys():
    cpu, e2e = _values(load_config(["run_dir=x"])), _values(load_config(["profile=e2e", "run_dir=x"]))
    own = _yaml_keys(CONF / "profile" / "e2e.yaml")
    assert {k for k in e2e if e2e[k] != cpu[k]} <= set(own)
    assert {k: e2e[k] for k in own} == own


def test_the_paper_profile_loads_without_a_gpu_and_changes_what_it_names():
    paper = _values(load_config(["profile=paper", "run_dir=x"]))
    own = _yaml_keys(CONF / "profile" / "paper.yaml")
    changed = {k: v for k, v in paper.items() if DEFAULTS[k] != v}
    changed.pop("run_dir")
    assert changed == own


# ------------------------------------------------------------------ signatures repeat no config value

# Config values the library takes as required arguments (they had a second default once).
REQUIRED = {
    "learner.loss.ClipConfig": ("clip_low", "clip_high", "dual_clip"),
    "learner.samples.GiGPO": ("gamma", "step_weight", "norm"),
    "learner.advantages.group_advantages": ("eps",),
    "learner.advantages.CountBonus": ("coef",),
    "learner.distributed.init": ("device",),
    "learner.policy_model.load_policy": ("device",),
    "learner.weight_push.WeightPusher": ("sync", "push_timeout_s", "tensor_parallel_size"),
    "memory_service.store.MemoryStore": ("capacity",),
    "memory_service.service.reflection_messages": ("mcfg",),
    "common.scienceworld.ScienceWorld": ("simplification",),
    "actors.env_actor.prompts.PromptBuilder": ("history_window",),
    "actors.policy_server.engine.PolicyEngine": ("weight_sync",),
    "actors.policy_server.engine.start_vllm": ("weight_sync",),
    "replay_buffer.buffer.ReplayBuffer": ("seed",),
}
# clipped_policy_loss takes the cap only for decoupled PPO: None there means "not decoupled"
OPTIONAL_NONE = {"learner.loss.clipped_policy_loss": ("behaviour_weight_cap",)}


def _resolve(qualname: str):
    module, name = qualname.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("qualname", sorted(REQUIRED))
def test_config_values_are_required_arguments(qualname):
    params = inspect.signature(_resolve(qualname)).parameters
    for name in REQUIRED[qualname]:
        assert params[name].default is inspect.Parameter.empty, f"{qualname}({name}=...) has a default"


def test_the_decoupled_cap_has_no_default_value():
    for qualname, names in OPTIONAL_NONE.items():
        params = inspect.signature(_resolve(qualname)).parameters
        assert all(params[n].default is None for n in names)


# parameter names that are config field names but mean something else there
NOT_CONFIG = {
    ("learner.step.StepTotals", "ratio"),  # a running sum of the ratio, not learner.ratio
    ("deploy.monitor.scrape", "timeout_s"),  # one HTTP scrape, not launch.timeout_s
    ("protocol.transport.Client", "timeout_s"),  # a request's default timeout, not launch.timeout_s
    ("testing.harness.LaunchedRun", "timeout_s"),  # how long a test or benchmark waits on its run
    # the temperature a response was sampled at, recorded with it (1.0: untempered, a record that predates
    # it), not env_actor.temperature
    ("protocol.messages.GenerateResponse", "temperature"),
    ("actors.policy_server.engine.Completion", "temperature"),
    ("protocol.messages.TurnRecord", "temperature"),
    ("learner.policy_model.response_logprobs", "temperature"),
}
PACKAGES = (
    "actors",
    "common",
    "deploy",
    "evaluation",
    "learner",
    "memory_service",
    "protocol",
    "replay_buffer",
    "testing",
)
SKIP_MODULES = {
    "actors.policy_server.worker_ext",  # imports vLLM at import time (runs inside the engine)
    "testing.factories",  # test data: its defaults (mode, seed) are a synthetic message's, not a run's
}


def _config_field_names() -> set[str]:
    names, todo = set(), [PipelineConfig]
    while todo:
        for f in dataclasses.fields(todo.pop()):
            names.add(f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(default):
                todo.append(type(default))
    return names


def _callables():
    for package in PACKAGES:
        # every module, those of subpackages too (actors/env_actor/, actors/policy_server/)
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}."):
            module_name = info.name
            if module_name in SKIP_MODULES or info.ispkg or module_name.rsplit(".", 1)[1] == "config":
                continue
            module = importlib.import_module(module_name)
            for name, obj in vars(module).items():
                if getattr(obj, "__module__", None) != module_name:
                    continue
                if inspect.isfunction(obj) or inspect.isclass(obj) and not dataclasses.is_dataclass(obj):
                    yield f"{module_name}.{name}", obj
                if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
                    yield f"{module_name}.{name}", obj  # its fields' defaults are its signature's


def test_no_library_signature_gives_a_config_value_a_default_of_its_own():
    names = _config_field_names()
    offenders = []
    for qualname, obj in _callables():
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            continue
        for name, param in params.items():
            if name in names and param.default not in (inspect.Parameter.empty, None):
                if (qualname, name) not in NOT_CONFIG:
                    offenders.append(f"{qualname}({name}={param.default!r})")
    assert offenders == [], "take these from the config object instead: " + ", ".join(offenders)


def test_configuration_md_states_the_defaults_the_dataclasses_hold():
    """Every `key` (N ...) in docs/configuration.md's tables (a bare key belongs to the section named
    last in its row) says the dataclass default: it documented max_ready_groups as 16, with 32 in the code."""
    import re

    cfg = PipelineConfig()
    sections = [f.name for f in dataclasses.fields(cfg) if dataclasses.is_dataclass(getattr(cfg, f.name))]
    defaults = {
        (s, f.name): getattr(getattr(cfg, s), f.name) for s in sections for f in dataclasses.fields(getattr(cfg, s))
    }
    doc = (Path(CONF_DIR).parent / "docs" / "configuration.md").read_text().replace("\u2212", "-")
    checked, wrong = 0, []
    for row in (line for line in doc.splitlines() if line.startswith("|")):
        section = None
        for m in re.finditer(r"`(?:(\w+)\.)?(\w+)`( \(([^()]*)\))?", row):
            named, key, _, said = m.groups()
            section = named or section
            value = defaults.get((section, key))
            if said is None or " / " in said or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            first = re.search(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e-?\d+)?(?![\w.])", re.sub(r"`[^`]*`", "", said))
            if first:
                checked += 1
                if float(first.group()) != float(value):
                    wrong.append(f"{section}.{key}: documented ({said}), default {value}")
    assert checked > 50 and not wrong, wrong
