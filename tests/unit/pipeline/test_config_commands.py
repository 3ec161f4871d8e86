"""The commands refuse a bad configuration before anything starts, answer --help without their
heavy imports, and empo2-config prints the resolved configuration (each as a subprocess, through
the installed console scripts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.cli import help_sections
from pipeline.roles import ROLES

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
ROLE_COMMANDS = sorted(c for c, role in ROLES.items() if role.console_script)  # empo2-run and every role's
# one bad choice per command, alternating between two fields
BAD = {
    command: ("learner.ratio=decopled", "learner.ratio", "plain, decoupled")
    if i % 2 == 0
    else ("weight_sync.method=ncl", "weight_sync.method", "zmq, shm, checkpoint, nccl")
    for i, command in enumerate(ROLE_COMMANDS)
}


def _start(argv: list[str], cwd: Path, profile_imports: bool = False) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", **({"PYTHONPROFILEIMPORTTIME": "1"} if profile_imports else {}))
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


def _imported(stderr: str) -> set[str]:
    """Top-level modules in a -X importtime listing (PYTHONPROFILEIMPORTTIME)."""
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0] for line in stderr.splitlines() if line.startswith("import time:")
    }


def test_a_bad_value_is_refused_by_every_command_before_anything_starts(tmp_path):
    runs = {}
    for command in ROLE_COMMANDS:
        cwd = tmp_path / command
        cwd.mkdir()
        override, _, _ = BAD[command]
        argv = [str(BIN / command), override, f"run_dir={cwd / 'run'}"]
        runs[command] = (cwd, _start(argv, cwd, profile_imports=True))
    # the launcher's way of starting a role: python -m pipeline <command>
    cwd = tmp_path / "python-m"
    cwd.mkdir()
    argv = [sys.executable, "-m", "pipeline", "empo2-replay-buffer", "learner.ratio=decopled", f"run_dir={cwd / 'run'}"]
    runs["python -m pipeline empo2-replay-buffer"] = (cwd, _start(argv, cwd))
    expected = {
        **BAD,
        "python -m pipeline empo2-replay-buffer": ("learner.ratio=decopled", "learner.ratio", "plain, decoupled"),
    }
    for name, (cwd, process) in runs.items():
        rc, out, err = _finish(process)
        override, key, choices = expected[name]
        message = [line for line in err.splitlines() if not line.startswith("import time:")]
        assert rc == 2, (name, out, err[-2000:])
        assert len(message) == 1 and "Traceback" not in err, (name, message)  # one line, no traceback
        value = override.split("=", 1)[1]
        assert f"{key}: " in message[0] and f"'{value}'" in message[0] and f"[{choices}]" in message[0], message
        assert list(cwd.iterdir()) == [], f"{name} created {list(cwd.iterdir())}"  # no run dir, no logs
        if name in ROLES:
            assert not {"torch", "vllm", "transformers"} & _imported(err), name


def test_every_command_answers_help_with_its_docstring_and_config(tmp_path):
    processes = {c: _start([str(BIN / c), "--help"], tmp_path, profile_imports=True) for c in ROLE_COMMANDS}
    for command, process in processes.items():
        rc, out, err = _finish(process)
        assert rc == 0, (command, err[-2000:])
        assert out.startswith(f"{command}: ") and "Run:" in out, out[:500]
        config = yaml.safe_load(out.split("e.g. profile=paper.\n\n", 1)[1])
        for section in help_sections(command):
            assert section in config, (command, section)
        assert not {"torch", "vllm", "transformers"} & _imported(err), command
    assert list(tmp_path.iterdir()) == []


def test_help_shows_the_values_of_the_given_profile(tmp_path):
    rc, out, _ = _finish(_start([str(BIN / "empo2-learner"), "profile=paper", "--help"], tmp_path))
    assert rc == 0
    learner = yaml.safe_load(out.split("e.g. profile=paper.\n\n", 1)[1])["learner"]
    assert learner["device"] == "cuda" and learner["groups_per_step"] == 16


def test_empo2_config_prints_the_resolved_configuration_as_yaml(tmp_path):
    rc, out, err = _finish(_start([str(BIN / "empo2-config"), "learner.lr=3e-6", "run_dir=runs/x"], tmp_path))
    assert rc == 0, err
    cfg = yaml.safe_load(out)
    assert cfg["run_dir"] == "runs/x" and cfg["learner"]["lr"] == pytest.approx(3e-6)
    assert cfg["replay_buffer"]["group_size"] == 4 and cfg["env"]["max_steps"] == 4  # the default profile: cpu
    assert cfg["learner"]["ratio"] == "plain" and cfg["weight_sync"]["method"] == "zmq"  # choices as values


def test_empo2_config_profile_paper_shows_the_papers_values(tmp_path):
    rc, out, err = _finish(_start([str(BIN / "empo2-config"), "profile=paper"], tmp_path))
    assert rc == 0, err  # no GPU needed to load it
    cfg = yaml.safe_load(out)
    assert cfg["model"]["name"] == "Qwen/Qwen2.5-7B-Instruct"
    assert cfg["replay_buffer"]["group_size"] == 8 and cfg["learner"]["groups_per_step"] == 16
    assert cfg["replay_buffer"]["p_memory"] == 0.25 and cfg["replay_buffer"]["q_off_policy"] == 0.68
    assert (cfg["learner"]["clip_low"], cfg["learner"]["clip_high"], cfg["learner"]["dual_clip"]) == (0.2, 0.3, 10.0)
    assert cfg["learner"]["lr"] == pytest.approx(1e-6)
    assert cfg["env"]["max_steps"] == 30 and cfg["env"]["max_steps_per_task"]["boil"] == 100
    assert cfg["env_actor"]["temperature"] == 1.0 and cfg["env_actor"]["max_action_tokens"] == 32
    assert cfg["policy_server"]["device"] == "cuda" and cfg["learner"]["device"] == "cuda"


def test_empo2_config_refuses_a_bad_value_with_exit_2(tmp_path):
    rc, out, err = _finish(_start([str(BIN / "empo2-config"), "profile=nope"], tmp_path))
    assert rc == 2 and out == ""
    assert (
        err.strip()
        == "empo2-config: bad configuration: profile: no 'nope' in conf/profile/; one of cpu, cpu_learn, e2e, paper"
    )


@pytest.mark.parametrize("override", ["++learner.lrr=5", "+learner.lrr=5"])
def test_empo2_config_refuses_an_added_key_the_schema_lacks(tmp_path, override):
    """Hydra adds a `+`/`++` key to the tree and the conversion to the dataclasses dropped it: the
    run went on without the setting the user asked for (issue 42)."""
    rc, out, err = _finish(_start([str(BIN / "empo2-config"), override], tmp_path))
    assert rc == 2 and out == ""
    assert err.strip() == (
        "empo2-config: bad configuration: learner.lrr: not a key of the configuration; did you mean learner.lr?"
    )


def test_the_preset_and_profile_lists_are_read_from_conf(capsys):
    """empo2-config --help and conf/pipeline.yaml's comment name every preset and profile in conf/."""
    from pipeline.cli import CONF_DIR, show_config

    presets = sorted(p.stem for p in (Path(CONF_DIR) / "preset").glob("*.yaml"))
    profiles = sorted(p.stem for p in (Path(CONF_DIR) / "profile").glob("*.yaml"))
    assert {"empo2", "grpo", "herl", "sge", "empo2_sge"} <= set(presets) and "cpu_learn" in profiles
    assert show_config(["--help"]) == 0
    shown = capsys.readouterr().out
    assert f"preset={'|'.join(presets)}" in " ".join(shown.split())
    assert f"profile={'|'.join(profiles)}" in " ".join(shown.split())
    comment = " ".join(line.lstrip("# ") for line in (Path(CONF_DIR) / "pipeline.yaml").read_text().splitlines())
    for name in [*presets, *profiles]:
        assert f" {name}," in comment or f" {name};" in comment or f" {name})" in comment, name
