"""deploy/monitoring/rules.yml: valid for promtool, its behaviour tested by promtool against
rules_test.yml, every metric it reads exported by some role, and the constants it copies from
the configuration equal to the configuration's defaults."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from common.metrics import exported_sample_names
from learner.config import LearnerConfig
from replay_buffer.config import ReplayBufferConfig

MONITORING = Path(__file__).resolve().parents[3] / "deploy" / "monitoring"
RULES = MONITORING / "rules.yml"
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (setup.sh)")


def _rules() -> dict[str, dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r.get("alert") or r["record"]: r for g in groups for r in g["rules"]}


@needs_promtool
def test_promtool_accepts_the_rules_and_their_tests_pass():
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(
        ["promtool", "test", "rules", "rules_test.yml"], cwd=MONITORING, capture_output=True, text=True
    )
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


@needs_promtool
def test_promtool_tests_can_fail(tmp_path):
    """The same tests against rules with the role-down alert's duration changed fail."""
    shutil.copy(MONITORING / "rules_test.yml", tmp_path)
    (tmp_path / "rules.yml").write_text(RULES.read_text().replace("for: 1m", "for: 5m", 1))
    test = subprocess.run(["promtool", "test", "rules", "rules_test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert test.returncode != 0 and "EMPO2RoleDown" in test.stdout + test.stderr


def test_every_metric_the_rules_read_is_exported():
    exported = exported_sample_names()
    read = set()
    for name, rule in _rules().items():
        for metric in re.findall(r"\bempo2_[a-z_]+\b", re.sub(r'"[^"]*"', "", rule["expr"])):  # not label values
            assert metric in exported, f"{name} reads {metric}, which no role exports"
            read.add(metric)
    assert len(read) >= 10


def test_the_alerts_cover_the_operations_issue():
    assert {
        "EMPO2RoleDown",
        "EMPO2NoLearnerStep",
        "EMPO2WeightPushesFailing",
        "EMPO2StalenessOverBound",
        "EMPO2BufferBacklog",
        "EMPO2MemoryFallbacks",
    } <= set(_rules())
    assert {"empo2:episodes:rate1m", "empo2:env_steps:rate1m", "empo2:generated_tokens:rate1m"} <= set(_rules())
    assert "empo2:learner_tokens:rate5m" in _rules()


def test_the_constants_copied_from_the_config_match_its_defaults():
    rules = _rules()
    assert f"> {LearnerConfig().max_staleness} " in rules["EMPO2StalenessOverBound"]["expr"]
    assert rules["EMPO2BufferBacklog"]["expr"].endswith(f">= {ReplayBufferConfig().max_ready_groups}")


@needs_promtool
def test_promtool_accepts_the_static_and_the_generated_prometheus_configs(tmp_path):
    from deploy.prometheus import RULES as GENERATED_RULES
    from deploy.prometheus import prometheus_config

    static = subprocess.run(
        ["promtool", "check", "config", str(MONITORING / "prometheus.yml")], capture_output=True, text=True
    )
    assert static.returncode == 0, static.stdout + static.stderr
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(tmp_path, "2s", [GENERATED_RULES])))
    generated = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True)
    assert generated.returncode == 0 and "SUCCESS: 12 rules found" in generated.stdout, (
        generated.stdout + generated.stderr
    )
