"""Slurm: a run as one batch job, composed from the same configuration as empo2-run.

    empo2-slurm [--dry-run] [--nodes N] [--partition P] [--time T] [--account A] [--gpus-per-node G]
                [--sbatch-arg ARG ...] [--insecure] [key=value ...]

writes <run_dir>/launch/slurm.sbatch and submits it with sbatch (--dry-run: prints it, submits nothing).
The run directory must be on a filesystem every node of the allocation shares (logs, the buffer log,
the memory store, checkpoints, heartbeats, Prometheus targets).

In the job, the batch step is the run's launcher (deploy/launch.py, exactly as empo2-run, its
supervision, restarts and summary included), and every role is a job step of its own, started with
`srun --overlap` on one node of the allocation (SlurmPlacement), hosts in SLURM_JOB_NODELIST order:

    node 0               the launcher, replay buffer, memory service, learner, periodic evaluator
    policy server i      node 1 + i mod (N-1) when N > 1 (the learner's node keeps its GPUs), else node 0
    env actor j          node j mod N

Endpoints are tcp://<node address>:<the configuration's port> (and NCCL's rendezvous the learner's node),
servers bind 0.0.0.0, every /metrics
page listens on 0.0.0.0 at its own port, and <run_dir>/prometheus/targets.json names each role's node
(`make monitor RUN_DIR=...`, or a Prometheus that reads the file). Once it leaves loopback the run
uses CURVE (keys written to <run_dir>/keys at submission, readable by the job's user only) unless
--insecure.

Stop: `scancel --batch --signal=TERM JOB` stops the roles in the launcher's order (the learner first,
the servers last; each role's step is given SIGTERM through scancel, since srun answers a SIGTERM of
its own by SIGKILLing its step) and ends the job; a plain `scancel JOB` gives every role SIGTERM at
once, each stops itself, and Slurm kills what is left after its KillWait. Before the time limit the launcher
is given SIGTERM (--signal=B:TERM@...) and stops the same way. Resume: submit the same script again
(`sbatch <run_dir>/launch/slurm.sbatch`): the learner resumes from its newest checkpoint, the buffer
replays its log, the memory service reopens its store.

Tested on a real Slurm (tests/integration/test_slurm.py: slurmctld and slurmd on one node, CPU only).
GPUs: every step sees its node's GPUs; policy_server.gpus and learner.gpus give each role its own
(its CUDA_VISIBLE_DEVICES), as on any host. Not done: heterogeneous jobs (GPU and CPU partitions in one
job), placement by GPU count (the table above is fixed).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.config import ConfigError
from common.process import signal_group
from deploy.launch import Placement
from deploy.launch import main as launch_main
from pipeline.cli import role_config
from pipeline.config import PipelineConfig, load_config
from pipeline.roles import RoleSpec

SCRIPT = Path("launch") / "slurm.sbatch"  # under the run directory
KEYS = "keys"  # under the run directory: the CURVE keys of the run (protocol/security.py)
REPO = Path(__file__).resolve().parent.parent
# set by the job from its allocation; the endpoints' hosts are too, their ports (and count) are the configuration's
SET_BY_SLURM = ("endpoints.bind_host=", "metrics.host=", "weight_sync.nccl_address=")


@dataclass(frozen=True)
class JobOptions:
    nodes: int = 1
    partition: str = ""  # "" = the cluster's default
    time: str = ""  # the job's time limit, sbatch --time (e.g. 1-00:00:00); "" = the partition's
    account: str = ""
    gpus_per_node: int = 0  # --gres=gpu:G on every node (policy_server.device / learner.device=cuda)
    sbatch_args: list[str] = field(default_factory=list)  # any other #SBATCH line, e.g. --qos=high
    secure: bool = True  # CURVE on every socket (security.curve), keys generated into <run_dir>/keys


class SlurmPlacement(Placement):
    """Each role on a node of the allocation (the module's table), started there as a job step."""

    def __init__(self, hosts: list[str], addresses: list[str]):
        self.hosts, self.addresses = hosts, addresses  # node names (srun -w) and how others reach them

    def node(self, kind: str, index: int) -> int:
        n = len(self.hosts)
        if kind == "policy_server" and n > 1:
            return 1 + index % (n - 1)
        if kind == "env_actor":
            return index % n
        return 0

    def host(self, kind: str, index: int, default: str) -> str:
        return self.addresses[self.node(kind, index)]

    def exec_prefix(self, spec: RoleSpec) -> tuple[str, ...]:
        # --overlap: the steps share the allocation's CPUs, memory and GPUs (without it a step waits for
        # the CPUs an earlier one holds); --kill-on-bad-exit=0: a role's exit is the launcher's to handle
        return (
            "srun", "--nodes=1", "--ntasks=1", f"--nodelist={self.hosts[self.node(spec.kind, spec.index)]}",
            "--overlap", "--kill-on-bad-exit=0", "--input=none", f"--job-name={spec.name}",
        )  # fmt: skip

    def terminate(self, process: subprocess.Popen, spec: RoleSpec, group: bool = False) -> None:
        # srun answers a SIGTERM by SIGKILLing its step: the role's step is signalled through Slurm
        # instead (every process of the step, as a group), so the role stops itself as it does here
        step = role_step(os.environ["SLURM_JOB_ID"], spec.name)
        if step is None:  # srun has not made the step yet: nothing to stop gracefully
            signal_group(process, signal.SIGKILL)
            return
        subprocess.run(["scancel", "--quiet", "--signal=TERM", step], check=False)

    def overrides(self, cfg: PipelineConfig) -> list[str]:
        """The configuration's endpoints moved to the nodes the servers run on (ports kept), servers
        and metrics open to the allocation's network."""

        def moved(kind: str, index: int, endpoint: str) -> str:
            return f"tcp://{self.host(kind, index, '')}:{endpoint.rsplit(':', 1)[1]}"

        servers = ",".join(moved("policy_server", i, e) for i, e in enumerate(cfg.endpoints.policy_servers))
        return [
            f"endpoints.policy_servers=[{servers}]",
            f"endpoints.replay_buffer={moved('replay_buffer', 0, cfg.endpoints.replay_buffer)}",
            f"endpoints.memory_service={moved('memory_service', 0, cfg.endpoints.memory_service)}",
            "endpoints.bind_host=0.0.0.0",
            "metrics.host=0.0.0.0",
            # weight_sync.method=nccl: the servers meet the learner at its node's address
            f"weight_sync.nccl_address={self.host('learner', 0, '')}",
        ]


def allocation() -> tuple[list[str], list[str]]:
    """The job's node names, in SLURM_JOB_NODELIST order, and each node's address (its NodeAddr:
    how Slurm itself reaches it, which a node name need not resolve to)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise RuntimeError("SLURM_JOB_NODELIST is not set: `python -m deploy.slurm --job` runs inside a Slurm job")
    hosts = _scontrol("show", "hostnames", nodelist).split()
    addresses = []
    for host in hosts:
        fields = dict(f.split("=", 1) for f in _scontrol("show", "node", host, "--oneliner").split() if "=" in f)
        addresses.append(fields.get("NodeAddr", host))
    return hosts, addresses


def role_step(job_id: str, name: str) -> str | None:
    """The running job step (JOB.STEP) of the role `name` (its step's name, srun --job-name), the
    newest if a restarted role's last step is still ending; None if it has none."""
    listed = subprocess.run(
        ["squeue", "--steps", "--noheader", f"--jobs={job_id}", "--format=%i %j"], capture_output=True, text=True
    ).stdout.split("\n")
    steps = [line.split()[0] for line in listed if line.split()[1:] == [name]]
    return max(steps, key=lambda s: int(s.rsplit(".", 1)[1]), default=None)


def _scontrol(*args: str) -> str:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, check=True).stdout


def run_job(overrides: list[str]) -> int:
    """The batch step: the launcher of the run, its roles placed on the allocation's nodes."""
    hosts, addresses = allocation()
    placement = SlurmPlacement(hosts, addresses)
    placed = [*overrides, *placement.overrides(load_config(overrides))]
    print(f"[slurm] job {os.environ.get('SLURM_JOB_ID')}: nodes {dict(zip(hosts, addresses))}", flush=True)
    return launch_main(placed, role_config("empo2-run", placed), placement)  # as empo2-run: validated, CURVE set


def sbatch_script(cfg: PipelineConfig, overrides: list[str], opts: JobOptions) -> str:
    run_dir = Path(cfg.run_dir)
    directives = [
        "--job-name=empo2",
        f"--nodes={opts.nodes}",
        "--ntasks-per-node=1",
        f"--output={run_dir / 'logs' / 'slurm-%j.out'}",
        "--open-mode=append",  # a resubmitted job's output follows the last one's
        # before the time limit the launcher (the batch step, exec'd) stops every role in order
        f"--signal=B:TERM@{int(cfg.launch.stop_grace_s) + 60}",
        *([f"--partition={opts.partition}"] if opts.partition else []),
        *([f"--time={opts.time}"] if opts.time else []),
        *([f"--account={opts.account}"] if opts.account else []),
        *([f"--gres=gpu:{opts.gpus_per_node}"] if opts.gpus_per_node else []),
        *opts.sbatch_args,
    ]
    command = [sys.executable, "-m", "deploy.slurm", "--job", *overrides]
    return "\n".join(
        [
            "#!/bin/bash",
            f"# written by empo2-slurm on {time.strftime('%Y-%m-%d %H:%M:%S')}; submit again to resume the run",
            *(f"#SBATCH {d}" for d in directives),
            "set -euo pipefail",
            f"cd {shlex.quote(str(REPO))}",
            f"exec {shlex.join(command)}",
            "",
        ]
    )


def prepare(overrides: list[str], opts: JobOptions) -> tuple[Path, str]:
    """The job's configuration (the run directory made absolute, CURVE keys unless --insecure) and
    its script, written to <run_dir>/launch/slurm.sbatch; (the script's path, its text)."""
    cfg = load_config(overrides)
    run_dir = Path(cfg.run_dir).resolve()
    job = [*overrides, f"run_dir={run_dir}"]
    if opts.secure:
        from protocol.security import generate_keys

        keys = run_dir / KEYS
        if not (keys / "server.key").exists():  # a resubmission keeps the run's keys
            generate_keys(keys)
        job += ["security.curve=true", f"security.keys_dir={keys}"]
    else:  # --insecure: the servers bind 0.0.0.0 without CURVE, which load_config refuses unless told
        job += ["security.insecure=true"]
    cfg = load_config(job)  # refused here, not in the job
    text = sbatch_script(cfg, job, opts)
    path = run_dir / SCRIPT
    path.parent.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    path.write_text(text)
    return path, text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="empo2-slurm",
        description="Write an sbatch script for the run the key=value overrides compose (every role a job "
        "step on a node of the allocation, the launcher the batch step) and submit it.",
    )
    d = JobOptions()
    p.add_argument("--dry-run", action="store_true", help="print the script (it is written too); submit nothing")
    p.add_argument("--nodes", type=int, default=d.nodes)
    p.add_argument("--partition", default=d.partition)
    p.add_argument("--time", default=d.time, help="sbatch --time, e.g. 1-00:00:00")
    p.add_argument("--account", default=d.account)
    p.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node)
    p.add_argument("--sbatch-arg", action="append", default=[], help="another #SBATCH directive (repeatable)")
    p.add_argument("--insecure", action="store_true", help="no CURVE (the allocation's network is trusted)")
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)  # the batch step (the script's command)
    p.add_argument("overrides", nargs="*", help="key=value, as for empo2-run")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.job:
        return run_job(args.overrides)
    taken = [o for o in args.overrides if o.startswith(SET_BY_SLURM)]
    if taken:
        print(f"empo2-slurm: {taken} are set by the job from its allocation", file=sys.stderr)
        return 2
    if args.nodes < 1:
        print("empo2-slurm: --nodes must be at least 1", file=sys.stderr)
        return 2
    opts = JobOptions(
        args.nodes, args.partition, args.time, args.account, args.gpus_per_node, args.sbatch_arg, not args.insecure
    )
    try:
        path, text = prepare(args.overrides, opts)
    except ConfigError as e:
        print(f"empo2-slurm: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(text, end="")
        print(f"empo2-slurm: wrote {path} (not submitted: sbatch {path})", file=sys.stderr)
        return 0
    if shutil.which("sbatch") is None:
        print(f"empo2-slurm: sbatch not found (run on a Slurm login node); the script is {path}", file=sys.stderr)
        return 2
    submitted = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if submitted.returncode != 0:
        print(f"empo2-slurm: sbatch refused {path}: {submitted.stderr.strip()}", file=sys.stderr)
        return submitted.returncode
    job_id = submitted.stdout.strip().split(";")[0]
    print(f"empo2-slurm: job {job_id}, script {path}; stop: scancel --batch --signal=TERM {job_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
