"""The deploy files agree with the code: scrape ports, dashboard metrics, systemd unit syntax."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from common.config import ConfigError, MetricsConfig
from common.metrics import exported_families, exported_sample_names
from deploy.monitoring.make_dashboard import NOT_ON_DASHBOARD, dashboard, uncovered
from pipeline.config import load_config
from pipeline.roles import ROLES

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def test_prometheus_targets_use_the_configured_ports():
    scrape = yaml.safe_load((DEPLOY / "monitoring" / "prometheus.yml").read_text())["scrape_configs"]
    ports = {job["job_name"]: [int(t.split(":")[1]) for t in job["static_configs"][0]["targets"]] for job in scrape}
    m = MetricsConfig()
    assert ports["empo2_policy_server"] == [m.port("policy_server", 0)]
    assert ports["empo2_replay_buffer"] == [m.port("replay_buffer")]
    assert ports["empo2_memory_service"] == [m.port("memory_service")]
    assert ports["empo2_learner"] == [m.port("learner")]
    assert ports["empo2_env_actor"] == [m.port("env_actor", 0), m.port("env_actor", 1)]


def test_dashboard_is_generated_and_uses_only_exported_metrics():
    committed = json.loads((DEPLOY / "monitoring" / "grafana-dashboard.json").read_text())
    assert committed == dashboard(), "run: python deploy/monitoring/make_dashboard.py"
    exported = exported_sample_names()
    for panel in committed["panels"]:
        for target in panel["targets"]:
            for name in re.findall(r"\bempo2_[a-z0-9_]+\b", target["expr"]):
                if name.endswith("_"):  # a regex prefix such as empo2_.*_messages_rejected_total
                    continue
                assert name in exported, f"panel {panel['title']!r} uses unknown metric {name}"


def test_every_exported_family_is_on_a_panel_or_deliberately_left_off():
    families = exported_families()
    assert uncovered(families) == set()
    assert set(NOT_ON_DASHBOARD) <= set(families)  # the list names real families, not stale ones


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_units_verify(tmp_path):
    repo = DEPLOY.parent
    for unit in (DEPLOY / "systemd").glob("empo2*"):
        if unit.suffix in (".service", ".target"):
            text = unit.read_text().replace("/etc/empo2/empo2.env", str(DEPLOY / "systemd" / "empo2.env.example"))
            (tmp_path / unit.name).write_text(text.replace("/opt/empo2", str(repo)))
    for template in tmp_path.glob("*@.service"):
        shutil.copy(template, tmp_path / template.name.replace("@", "@0"))
    units = [str(p) for p in tmp_path.iterdir() if "@." not in p.name]
    result = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_grafana_provisioning_points_at_the_dashboard_and_a_prometheus():
    provisioning = DEPLOY / "monitoring" / "grafana" / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "empo2.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"].startswith("http://127.0.0.1:")
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "empo2.yml").read_text())["providers"]
    path = Path(provider["options"]["path"].replace("/opt/empo2", str(DEPLOY.parent)))  # install.sh's prefix
    assert (path / "grafana-dashboard.json").exists()
    assert json.loads((path / "grafana-dashboard.json").read_text())["templating"]["list"][0]["query"] == "prometheus"


def _env_file_args() -> list[str]:
    """EMPO2_ARGS of the example environment file, split as systemd splits an unbraced $VAR."""
    for line in (DEPLOY / "systemd" / "empo2.env.example").read_text().splitlines():
        if line.startswith("EMPO2_ARGS="):
            return line.removeprefix("EMPO2_ARGS=").split()
    raise AssertionError("empo2.env.example sets no EMPO2_ARGS")


def test_each_unit_starts_an_installed_entry_point_with_arguments_load_config_accepts():
    pyproject = (DEPLOY.parent / "pyproject.toml").read_text()
    installed = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")}
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert len(units) == 5
    for unit in units:
        (exec_start,) = [line for line in unit.read_text().splitlines() if line.startswith("ExecStart=")]
        binary, *args = exec_start.removeprefix("ExecStart=").split()
        command = Path(binary).name
        assert binary == f"/opt/empo2/.venv/bin/{command}", unit.name  # install.sh rewrites the prefix
        entry = installed.get(command, "")
        assert f'{command} = "{entry}"' in pyproject, f"{unit.name}: {command} is not an installed [project.scripts]"
        assert entry.startswith("pipeline.cli:") and command in ROLES  # it loads the config first
        args = [a for a in args if a != "$EMPO2_ARGS"] + _env_file_args()
        # an instance, as `systemctl start empo2-env-actor@3`; the example env file lists one policy server
        instance = 0 if "policy-server" in unit.name else 3
        cfg = load_config([a.replace("%i", str(instance)) for a in args])
        if "@" in unit.name:
            kind = unit.name.split("@")[0].removeprefix("empo2-").replace("-", "_")
            assert getattr(cfg, kind).index == instance
    with pytest.raises(ConfigError):  # and the same arguments with a bad one are refused at load
        load_config([*_env_file_args(), "env_actor.index=-1"])


def _learner_token(env_file: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(DEPLOY / "systemd" / "learner_token.sh"), str(env_file)], capture_output=True, text=True
    )


def _tokens(env_file: Path) -> list[str]:
    return [
        line.split("=", 1)[1] for line in env_file.read_text().splitlines() if line.startswith("EMPO2_LEARNER_TOKEN=")
    ]


def test_install_gives_the_environment_file_a_random_learner_token_once_and_mode_600(tmp_path):
    """Secure by default (issue 26): install.sh runs learner_token.sh on the installed environment
    file; a file without a token gets a random one (the roles read it as security.learner_token),
    a second run keeps it, and a token the operator set (the variable, or in EMPO2_ARGS) stays theirs."""
    assert '"$here/learner_token.sh" /etc/empo2/empo2.env' in (DEPLOY / "systemd" / "install.sh").read_text()
    first, second = tmp_path / "a.env", tmp_path / "b.env"
    for env_file in (first, second):
        shutil.copy(DEPLOY / "systemd" / "empo2.env.example", env_file)
        env_file.chmod(0o644)
        assert _learner_token(env_file).returncode == 0
        assert env_file.stat().st_mode & 0o777 == 0o600
    (token,) = _tokens(first)
    assert len(token) >= 32 and re.fullmatch(r"[A-Za-z0-9_-]+", token) and _tokens(second) != [token]
    assert _learner_token(first).returncode == 0 and _tokens(first) == [token]  # kept
    assert (
        _env_file_args()
        == [  # the rest of the file as it was
            line.removeprefix("EMPO2_ARGS=").split() for line in first.read_text().splitlines() if "EMPO2_ARGS=" in line
        ][0]
    )

    mine = tmp_path / "mine.env"
    mine.write_text("EMPO2_ARGS=run_dir=/tmp/r security.learner_token=operators\n")
    assert _learner_token(mine).returncode == 0 and _tokens(mine) == []
    empty = tmp_path / "empty.env"
    empty.write_text("EMPO2_LEARNER_TOKEN=\n")
    assert _learner_token(empty).returncode == 0 and len(_tokens(empty)) == 1 and _tokens(empty)[0]


def test_the_two_host_line_uses_the_keys_install_makes_and_is_refused_without_curve():
    """Off loopback the units need CURVE (pipeline/config.py refuses servers bound off loopback without
    it): the example's two-host line turns it on with the keys install.sh makes once."""
    line = next(
        x for x in (DEPLOY / "systemd" / "empo2.env.example").read_text().splitlines() if x.startswith("#EMPO2_ARGS=")
    )
    args = line.removeprefix("#EMPO2_ARGS=").split()
    assert load_config(args).security.keys_dir == "/etc/empo2/keys"
    with pytest.raises(ConfigError, match="security.curve"):
        load_config([a for a in args if not a.startswith("security.")])
    assert '"$prefix/.venv/bin/empo2-keys" /etc/empo2/keys' in (DEPLOY / "systemd" / "install.sh").read_text()
