"""empo2-slurm on a real Slurm (deploy/slurm.py): munged, slurmctld and slurmd of Debian's slurm-wlm
(scripts/setup.sh installs it where sbatch is missing) on this one node, with a configuration written
here (proctrack/linuxproc, task/none). The e2e profile is submitted as a batch job: every role a job
step, the launcher the batch step; it trains a step and pushes it, a plain `scancel` stops it with
nothing left running, and the same script submitted again resumes the run to its end."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, TEST_RUN_ENV, marked_processes, wait_for

pytestmark = pytest.mark.e2e
BASE = 18500  # metrics.base_port: server 18500, buffer 18600, memory 18601, launcher 18602, learner 18700, ...
OVERRIDES = [
    "profile=e2e",
    "learner.total_steps=2",
    "learner.checkpoint_every=1",
    "endpoints.policy_servers=[tcp://127.0.0.1:17650]",
    "endpoints.replay_buffer=tcp://127.0.0.1:17660",
    "endpoints.memory_service=tcp://127.0.0.1:17670",
    f"metrics.base_port={BASE}",
    "launch.progress_every_s=15",
]
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch")
JOB_TIMEOUT_S = 900


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm_conf(root: Path) -> Path:
    node = socket.gethostname().split(".")[0]  # slurmd's own name for this host
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir(parents=True)
    conf = root / "slurm.conf"
    conf.write_text(
        f"""ClusterName=empo2test
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=30
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    return conf


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> dict[str, str]:
    """A one-node Slurm cluster for this module; the environment its commands need (SLURM_CONF)."""
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        pytest.fail(f"{missing} not found: scripts/setup.sh installs slurm-wlm and munge (as root)")
    root = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURM_CONF": str(_slurm_conf(root))}
    daemon_env = {k: v for k, v in env.items() if k != TEST_RUN_ENV}  # not the test run's: stopped here
    started = []
    if not Path("/run/munge/munge.socket.2").exists():  # a munged already running (a Slurm host) is used
        Path("/run/munge").mkdir(exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        started.append(subprocess.Popen(["runuser", "-u", "munge", "--", "munged", "--foreground"], env=daemon_env))
    for daemon in ("slurmctld", "slurmd"):
        log = open(root / "log" / f"{daemon}.out", "ab")
        started.append(subprocess.Popen([daemon, "-D"], env=daemon_env, stdout=log, stderr=subprocess.STDOUT))
    try:
        idle = lambda: subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True).stdout
        assert wait_for(lambda: idle().strip() == "idle", timeout_s=60, poll_s=1), (idle(), (root / "log").iterdir())
        yield env
    finally:
        subprocess.run(["scancel", "--full", "--user=root"], env=env, check=False)
        for process in reversed(started):
            process.terminate()
            process.wait(timeout=30)


def _squeue(env: dict, job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True).stdout.strip()


def _wait_job_end(env: dict, job: str, timeout_s: float) -> None:
    assert wait_for(lambda: not _squeue(env, job), timeout_s=timeout_s, poll_s=2), _squeue(env, job)


def test_a_run_submitted_to_slurm_trains_stops_on_scancel_and_resumes_to_its_end(slurm, tmp_path):
    run_dir = tmp_path / "run"
    submitted = subprocess.run(
        [sys.executable, "-m", "deploy.slurm", *OVERRIDES, f"run_dir={run_dir}"],
        env=slurm, cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = re.search(r"job (\d+)", submitted.stdout).group(1)
    script = run_dir / "launch" / "slurm.sbatch"
    assert "security.curve=true" in script.read_text()  # off loopback: CURVE, keys in the run directory
    output = lambda j: (run_dir / "logs" / f"slurm-{j}.out").read_text(errors="replace")  # noqa: E731

    # a step trained and pushed: the roles found each other at the node's address, through CURVE
    trained = lambda: (run_dir / "checkpoints" / "step_000001").is_dir() and "versions [1]" in output(job)  # noqa: E731
    assert wait_for(trained, timeout_s=JOB_TIMEOUT_S, poll_s=2), output(job)[-3000:]
    steps = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"], env=slurm, capture_output=True, text=True)
    assert {"policy_server0", "replay_buffer", "memory_service", "env_actor0", "env_actor1", "learner"} <= set(
        steps.stdout.split()
    ), steps.stdout  # every role its own job step
    targets = json.loads((run_dir / "prometheus" / "targets.json").read_text())
    assert {t["targets"][0] for t in targets} >= {f"127.0.0.1:{BASE}", f"127.0.0.1:{BASE + 200}"}  # each role's node

    # scancel as a user types it: every role stopped, nothing of the job left on the node
    subprocess.run(["scancel", job], env=slurm, check=True)
    _wait_job_end(slurm, job, timeout_s=90)
    ours = os.environ[TEST_RUN_ENV].split()[-1]
    assert wait_for(lambda: not marked_processes(ours), timeout_s=30, poll_s=1), marked_processes(ours)

    # the same script again: the run resumes from its checkpoint and ends, the launcher stopping each role
    # through Slurm (a SIGTERM to srun would SIGKILL its step)
    logs = {log: log.stat().st_size for log in (run_dir / "logs").glob("*.log")}
    resubmitted = subprocess.run(["sbatch", "--parsable", str(script)], env=slurm, capture_output=True, text=True)
    assert resubmitted.returncode == 0, resubmitted.stderr
    again = resubmitted.stdout.strip()
    _wait_job_end(slurm, again, timeout_s=JOB_TIMEOUT_S)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "done" and summary["policy_version"] == 2, (summary, output(again)[-3000:])
    assert "resumed from" in (run_dir / "logs" / "learner.log").read_text()
    for log, before in logs.items():  # srun writes into the role's log what befell its step
        with open(log, "rb") as f:
            this_job = f.read()[before:].decode(errors="replace")
        assert "Killed" not in this_job and "forcing job termination" not in this_job, (log.name, this_job[-2000:])
    assert not marked_processes(ours)
