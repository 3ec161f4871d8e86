"""empo2-slurm's parts that need no Slurm (deploy/slurm.py): where each role goes in an allocation, the
endpoints moved there with their ports, the script and its keys, what is refused, the step of a role;
and the launcher starting and stopping roles through a Placement. The real Slurm run is
tests/integration/test_slurm.py."""

from __future__ import annotations

import json
import os
import stat
import time

from deploy.launch import Launcher, Placement
from deploy.run_state import TARGETS_FILE
from deploy.slurm import SlurmPlacement, main, role_step
from pipeline.config import load_config
from pipeline.roles import LEARNER_TOKEN_ENV, RoleSpec

STUB = "tests.unit.deploy.role_stub"
HOSTS = ["gpu-a", "gpu-b", "gpu-c"]
ADDRESSES = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def test_the_learners_node_hosts_the_single_roles_servers_go_to_the_others_actors_everywhere():
    placement = SlurmPlacement(HOSTS, ADDRESSES)
    assert [placement.node("policy_server", i) for i in range(4)] == [1, 2, 1, 2]
    assert [placement.node("env_actor", j) for j in range(4)] == [0, 1, 2, 0]
    assert {placement.node(k, 0) for k in ("learner", "replay_buffer", "memory_service", "evaluator", "launch")} == {0}
    alone = SlurmPlacement(["n1"], ["n1"])
    assert {alone.node(k, i) for k in ("policy_server", "env_actor", "learner") for i in range(3)} == {0}
    prefix = placement.exec_prefix(RoleSpec("policy_server1", ["pipeline"], "policy_server", 1))
    assert prefix[0] == "srun" and "--nodelist=gpu-c" in prefix and "--overlap" in prefix
    assert "--job-name=policy_server1" in prefix  # how role_step finds its step


def test_the_endpoints_move_to_their_nodes_with_their_ports_and_the_servers_open_to_the_allocation():
    cfg = load_config(["endpoints.policy_servers=[tcp://127.0.0.1:5550,tcp://127.0.0.1:5551]"])
    overrides = SlurmPlacement(HOSTS, ADDRESSES).overrides(cfg)
    servers = "endpoints.policy_servers=[tcp://127.0.0.1:5550,tcp://127.0.0.1:5551]"
    placed = load_config([servers, *overrides, "security.curve=true"])  # the job's CURVE: off loopback
    assert placed.endpoints.policy_servers == ["tcp://10.0.0.2:5550", "tcp://10.0.0.3:5551"]
    assert placed.endpoints.replay_buffer == f"tcp://10.0.0.1:{cfg.endpoints.replay_buffer.rsplit(':', 1)[1]}"
    assert placed.endpoints.memory_service.startswith("tcp://10.0.0.1:")
    assert placed.endpoints.bind_host == "0.0.0.0" and placed.metrics.host == "0.0.0.0"
    assert placed.weight_sync.nccl_address == "10.0.0.1"  # the learner's node: NCCL's rendezvous


def test_a_dry_run_writes_the_script_with_an_absolute_run_dir_and_the_runs_own_keys(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--dry-run", "--nodes", "3", "--time", "1:00:00", "--gpus-per-node", "8", "run_dir=runs/r"]) == 0
    script = capsys.readouterr().out
    run_dir = tmp_path / "runs" / "r"
    assert script == (run_dir / "launch" / "slurm.sbatch").read_text()
    for directive in ("--nodes=3", "--time=1:00:00", "--gres=gpu:8", f"--output={run_dir}/logs/slurm-%j.out"):
        assert f"#SBATCH {directive}\n" in script
    assert f"run_dir={run_dir} " in script and "-m deploy.slurm --job" in script
    assert f"security.curve=true security.keys_dir={run_dir}/keys" in script
    secret = run_dir / "keys" / "server.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    before = secret.read_bytes()
    assert main(["--dry-run", "run_dir=runs/r"]) == 0  # a second submission keeps the run's keys
    assert secret.read_bytes() == before
    capsys.readouterr()
    assert main(["--dry-run", "--insecure", "run_dir=runs/s"]) == 0
    insecure = capsys.readouterr().out
    assert "security.curve" not in insecure and not (tmp_path / "runs" / "s" / "keys").exists()
    assert "security.insecure=true" in insecure  # servers off loopback without CURVE: said, not refused


def test_what_the_job_sets_a_bad_value_and_a_host_without_sbatch_are_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["endpoints.bind_host=0.0.0.0"]) == 2
    assert "set by the job" in capsys.readouterr().err
    assert main(["--nodes", "0"]) == 2
    assert main(["learner.lr=-1"]) == 2
    assert "learner.lr" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    assert main(["run_dir=runs/t"]) == 2
    assert "sbatch not found" in capsys.readouterr().err and (tmp_path / "runs/t/launch/slurm.sbatch").exists()


def test_a_roles_step_is_its_newest_step_of_that_name(tmp_path, monkeypatch):
    squeue = tmp_path / "squeue"  # a stand-in for Slurm's squeue: what it lists for the job
    squeue.write_text("#!/bin/sh\nprintf '7.0 policy_server0\\n7.3 learner\\n7.12 learner\\n7.batch batch\\n'\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert role_step("7", "learner") == "7.12"
    assert role_step("7", "policy_server0") == "7.0"
    assert role_step("7", "env_actor0") is None


class _Elsewhere(Placement):
    """Roles 'on another host': the prefix sets the variable the stub writes back, the host names
    their metrics, and every stop is recorded before it is made."""

    def __init__(self):
        self.stopped = []

    def host(self, kind, index, default):
        return "10.1.2.3"

    def exec_prefix(self, spec):
        return ("env", f"{LEARNER_TOKEN_ENV}=placed-{spec.name}")

    def terminate(self, process, spec, group=False):
        self.stopped.append(spec.name)
        super().terminate(process, spec, group)


def test_the_launcher_starts_names_and_stops_roles_where_its_placement_says(tmp_path):
    out = tmp_path / "token"
    cfg = load_config([f"run_dir={tmp_path}", "metrics.base_port=31500", "launch.stop_grace_s=5"])
    placement = _Elsewhere()
    roles = [RoleSpec("env_actor0", [STUB], "env_actor", 0, args=(f"token:{out}",))]
    launcher = Launcher(cfg, [], roles=roles, publish=True, placement=placement)
    launcher.start()
    try:
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.read_text() == "placed-env_actor0"  # started through the placement's prefix
        targets = json.loads((tmp_path / TARGETS_FILE).read_text())
        assert {t["targets"][0] for t in targets} == {"10.1.2.3:31800", "10.1.2.3:31602"}
    finally:
        launcher.stop()
    assert placement.stopped == ["env_actor0"] and launcher.children[0].final_exit is not None
