"""The role table (pipeline/roles.py) is what each role's main is given: its sections by name and
the run's facts, nothing else; the facts a role is given match the configuration they come from."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

from common.config import RunFacts
from common.heartbeat import heartbeat_path
from pipeline.cli import given
from pipeline.config import PipelineConfig, load_config, run_facts
from pipeline.roles import ROLES, run_roles

REPO = Path(__file__).resolve().parents[3]
SECTIONS = {f.name for f in dataclasses.fields(PipelineConfig)}
ROLE_COMMANDS = sorted(c for c, role in ROLES.items() if not role.driver)


@pytest.mark.parametrize("command", ROLE_COMMANDS)
def test_a_roles_main_takes_its_sections_and_the_run_facts_only(command):
    role = ROLES[command]
    main = importlib.import_module(role.module).main
    assert list(inspect.signature(main).parameters) == [*role.sections, "run"]
    assert set(role.sections) <= SECTIONS


@pytest.mark.parametrize("command", ROLE_COMMANDS)
def test_no_role_reads_a_section_it_is_not_given(command):
    """A role's package never names another section of the tree as `cfg.<section>`: what it needs of
    the run comes in RunFacts (e.g. `run.memory_in_use`, not `cfg.replay_buffer.p_memory`)."""
    package = ROLES[command].module.split(".")[0]
    others = SECTIONS - {"run_dir", "seed", "startup_timeout_s"}
    offending = []
    for path in sorted((REPO / package).rglob("*.py")):
        for name in re.findall(r"\bcfg\.([a-z_]+)\.", path.read_text()):
            if name in others:
                offending.append(f"{path.relative_to(REPO)}: cfg.{name}")
    assert not offending


def test_the_run_facts_defaults_are_the_default_configurations():
    """RunFacts() (what a unit test of one role uses) says what the default configuration derives,
    but for the door limits (none checked by default)."""
    derived = run_facts(PipelineConfig())
    assert dataclasses.replace(derived, door=RunFacts().door) == RunFacts()


def test_given_hands_each_role_its_sections_and_its_metrics_port(tmp_path):
    cfg = load_config([f"run_dir={tmp_path}", "env_actor.index=3", "replay_buffer.p_memory=0"])
    actor = given("empo2-env-actor", cfg)
    assert set(actor) == {"env_actor", "env", "sge", "run"} and actor["env_actor"] is cfg.env_actor
    assert actor["run"].metrics_port == cfg.metrics.port("env_actor", 3)
    assert actor["run"].memory_in_use is False and actor["run"].max_model_len == cfg.policy_server.max_model_len
    server = given("empo2-policy-server", load_config([f"run_dir={tmp_path}"]))
    assert server["run"].metrics_port == cfg.metrics.port("policy_server", 0)


def test_each_process_is_given_the_heartbeat_file_the_launcher_watches(tmp_path):
    """role_facts names the heartbeat file after the process's name in the run (pipeline/roles.py,
    process_name), the same as the launcher's RoleSpec.name: what it writes is what is watched."""
    cfg = load_config(
        [f"run_dir={tmp_path}", "launch.num_env_actors=2", "eval.every_steps=2", "learner.checkpoint_every=2"]
    )
    watched = {s.name for s in run_roles(cfg) if s.heartbeat}
    assert watched == {"policy_server0", "memory_service", "replay_buffer", "env_actor0", "env_actor1", "learner"}
    for spec in run_roles(cfg):
        if not spec.heartbeat:
            assert spec.name == "evaluator"  # a driver: no heartbeat
            continue
        command, overrides = spec.argv[1], [f"run_dir={tmp_path}", *spec.args]
        path = given(command, load_config(overrides))["run"].heartbeat_path
        assert path == str(heartbeat_path(tmp_path, spec.name)), spec.name


def test_the_run_roles_start_every_role_through_the_pipeline_command(tmp_path):
    cfg = load_config([f"run_dir={tmp_path}", "launch.num_env_actors=2"])
    specs = run_roles(cfg)
    assert [s.name for s in specs] == [
        "policy_server0",
        "memory_service",
        "replay_buffer",
        "env_actor0",
        "env_actor1",
        "learner",
    ]
    assert all(s.argv[0] == "pipeline" and s.argv[1] in ROLES for s in specs)
    assert [s.name for s in specs if s.learner_token] == ["replay_buffer", "learner"]
    assert specs[4].args == ("env_actor.index=1",) and specs[-1].ends_run


def test_the_rollout_side_is_the_policy_servers_the_env_actors_and_the_memory_service():
    # pipeline.rollout_nice applies to these (pipeline/cli.py), never to the learner or the buffer
    assert {r.command for r in ROLES.values() if r.rollout} == {
        "empo2-policy-server",
        "empo2-env-actor",
        "empo2-memory-service",
    }


def test_each_gpu_role_is_shown_its_own_gpus_before_its_module_is_imported(monkeypatch):
    """pipeline/cli.py run(): CUDA_VISIBLE_DEVICES from policy_server.gpus[index] / learner.gpus, set
    before the role's module (and CUDA) is imported, on every launch path; other roles keep the host's."""
    import os

    import pipeline.cli

    seen = {}

    class Role:  # stands in for a role's module: records what its process was shown, starts nothing
        @staticmethod
        def main(**given):
            seen["gpus"] = os.environ.get("CUDA_VISIBLE_DEVICES")

    real = pipeline.cli.importlib.import_module
    roles = {r.module for r in ROLES.values()}
    monkeypatch.setattr(pipeline.cli.importlib, "import_module", lambda name: Role if name in roles else real(name))
    monkeypatch.setattr(pipeline.cli, "lower_cpu_priority", lambda nice: None)  # not this test process's
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    servers = ["endpoints.policy_servers=[tcp://127.0.0.1:5550,tcp://127.0.0.1:5551]", "policy_server.gpus=[[2],[3]]"]
    pipeline.cli.run("empo2-policy-server", [*servers, "policy_server.index=1"])
    assert seen["gpus"] == "3"
    pipeline.cli.run("empo2-learner", ["learner.gpus=[4,5]"])
    assert seen["gpus"] == "4,5"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    pipeline.cli.run("empo2-replay-buffer", [*servers, "learner.gpus=[4,5]"])
    assert seen["gpus"] is None


def test_the_launcher_starts_a_learner_of_several_ranks_under_torchrun():
    one = run_roles(load_config([]))[-1]
    assert one.argv == ["pipeline", "empo2-learner"] and one.ends_run
    four = run_roles(load_config(["launch.learner_ranks=4"]))[-1]
    assert four.argv == [
        "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m", "pipeline", "empo2-learner"
    ]  # fmt: skip
    assert four._replace(argv=one.argv) == one  # the same role otherwise: name, metrics, token, heartbeat


def test_a_flag_of_the_role_table_runs_its_function_without_a_run_configuration(tmp_path, capsys):
    """empo2-run --attach (ROLES' flags): deploy.launch.attach_main on the rest, no configuration loaded
    for the command itself; here it refuses a directory that is not a running launcher's (exit 2)."""
    import pipeline.cli

    assert dict(ROLES["empo2-run"].flags) == {"--attach": "attach_main"}
    assert pipeline.cli.run("empo2-run", ["--attach", str(tmp_path / "nothing"), "launch.num_env_actors=2"]) == 2
