"""The monitoring wiring with a real Prometheus (Debian's package) and the real launcher, around
stand-in roles that serve real role metrics (tests/unit/deploy/role_stub.py): no vLLM, no JVM, a
few seconds. Prometheus finds the targets through the launcher's file-based discovery, an actor
killed with SIGKILL fires EMPO2RoleDown for it, its restart is in empo2_launch_restarts_total
with the role's own label, the targets follow a new actor, and the env-steps recording rule
gives the stand-ins' rate. (tests/integration/test_operations.py does the same against the real
pipeline.)"""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
import urllib.parse
import urllib.request

import pytest

from common.process import stop_group
from deploy.launch import Launcher
from deploy.prometheus import RULES, start_prometheus, wait_ready
from deploy.run_state import kill_role, wait_for_role
from pipeline.config import load_config
from pipeline.roles import RoleSpec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed (scripts/setup.sh)"),
]
BASE = 31700  # metrics.base_port: actors 32000.., the launcher 31802
PROMETHEUS = "127.0.0.1:31990"
STUB = "tests.unit.deploy.role_stub"


def _api(path: str, **params) -> dict:
    url = f"http://{PROMETHEUS}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())["data"]


def _until(what: str, condition, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {_health()}"
        time.sleep(0.3)
    return value


def _health() -> dict[str, str]:
    return {t["labels"].get("role", t["labels"]["job"]): t["health"] for t in _api("targets")["activeTargets"]}


def test_prometheus_follows_the_launcher_and_alerts_on_a_killed_role(tmp_path, monkeypatch):
    import deploy.launch

    cfg = load_config([f"run_dir={tmp_path}", f"metrics.base_port={BASE}", "launch.backoff_s=4"])
    actor = lambda j: RoleSpec(
        f"env_actor{j}", [STUB], "env_actor", j, args=(f"serve:{cfg.metrics.port('env_actor', j)}",)
    )
    monkeypatch.setattr(deploy.launch, "env_actor_spec", actor)  # scaling starts stand-ins too, not ScienceWorld
    launcher = Launcher(cfg, [], roles=[actor(0), actor(1)], publish=True)
    rules = tmp_path / "rules.yml"
    rules.write_text(re.sub(r"for: \w+", "for: 0s", RULES.read_text()))  # durations: promtool-tested
    prometheus = start_prometheus(tmp_path, PROMETHEUS, "1s", [rules], tmp_path / "prometheus.log")
    try:
        launcher.start()
        wait_ready(PROMETHEUS, 60, prometheus)
        supervise = lambda: launcher.supervise(time.monotonic()) is None
        _until(
            "every target up",
            lambda: supervise() and _health() == dict.fromkeys(["env_actor0", "env_actor1", "empo2_launch"], "up"),
        )

        kill_role(tmp_path, "env_actor1", signal.SIGKILL)

        def firing():
            supervise()
            alerts = _api("alerts")["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "EMPO2RoleDown" and a["state"] == "firing"]

        (alert,) = _until("EMPO2RoleDown", firing)
        assert (alert["labels"]["role"], alert["labels"]["job"]) == ("env_actor1", "empo2_env_actor")
        wait_for_role(tmp_path, "env_actor1", 1, 60, alive=supervise)
        restarts = _until(
            "the restart in Prometheus",
            lambda: (
                supervise() and _api("query", query='empo2_launch_restarts_total{role="env_actor1"} == 1')["result"]
            ),
        )
        assert restarts[0]["metric"]["job"] == "empo2_launch"
        _until("env_actor1 up again", lambda: supervise() and _health().get("env_actor1") == "up")

        launcher.scale_env_actors(3, time.monotonic())  # what --attach asks for: env_actor2 joins
        _until("env_actor2 a target and up", lambda: supervise() and _health().get("env_actor2") == "up")
        steps = _until("env steps/s", lambda: supervise() and _api("query", query="empo2:env_steps:rate1m")["result"])
        # > 0, not ~30: rate() over 1m of series younger than a minute divides their increase by the window
        assert 0 < float(steps[0]["value"][1]) < 40  # three stand-ins at ~10 steps/s at most
    finally:
        launcher.stop()
        stop_group(prometheus, grace_s=10)
