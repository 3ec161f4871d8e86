"""Two hosts, for real: two Linux network namespaces joined by a veth pair, addresses chosen here.
Host A runs the learner, the replay buffer and the memory service; host B a policy server and an
env actor. Every endpoint comes from the configuration, each host with its own (a server binds
tcp://0.0.0.0:PORT, its clients connect to the other host's address), and each host its own run
directory (no shared filesystem: weights go by weight_sync.method=zmq). A learner step happens on
A and the new weights go live on B. Skipped, with the reason, where namespaces cannot be made
(not root, no `ip`, no CAP_SYS_ADMIN)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import time

import pytest

from common.process import spawn_command, stop_group
from pipeline.config import load_config
from pipeline.roles import LEARNER_TOKEN_ENV
from tests.helpers import REPO

pytestmark = pytest.mark.e2e
PORTS = {"policy_server": 8550, "replay_buffer": 8560, "memory_service": 8570}
TIMEOUT_S = 600


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def hosts():
    """(namespace A, address A, namespace B, address B), removed afterwards."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2): cannot make network namespaces")
    tag = os.getpid() % 100000
    a, b = f"empo2a{tag}", f"empo2b{tag}"
    subnet = f"10.{200 + tag % 50}.{tag % 250}"
    made = _ip("netns", "add", a)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {made.stderr.strip()}")
    try:
        steps = [
            ("netns", "add", b),
            ("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}"),
            ("link", "set", f"va{tag}", "netns", a),
            ("link", "set", f"vb{tag}", "netns", b),
            ("-n", a, "addr", "add", f"{subnet}.1/30", "dev", f"va{tag}"),
            ("-n", b, "addr", "add", f"{subnet}.2/30", "dev", f"vb{tag}"),
            ("-n", a, "link", "set", f"va{tag}", "up"),
            ("-n", b, "link", "set", f"vb{tag}", "up"),
            ("-n", a, "link", "set", "lo", "up"),
            ("-n", b, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            assert done.returncode == 0, f"ip {' '.join(step)}: {done.stderr}"
        yield a, f"{subnet}.1", b, f"{subnet}.2"
    finally:
        _ip("netns", "del", a)  # the veth pair goes with it
        _ip("netns", "del", b)


def test_a_learner_step_on_one_host_reaches_the_policy_server_on_the_other(hosts, tmp_path):
    a, addr_a, b, addr_b = hosts
    # the veth pair is this test's private network: no CURVE (off loopback, so said with security.insecure)
    common = ["profile=e2e", "learner.total_steps=1", "metrics.host=0.0.0.0", "security.insecure=true"]
    host_a = [
        *common,
        f"run_dir={tmp_path / 'a'}",
        f"endpoints.replay_buffer=tcp://0.0.0.0:{PORTS['replay_buffer']}",
        f"endpoints.memory_service=tcp://0.0.0.0:{PORTS['memory_service']}",
        f"endpoints.policy_servers=[tcp://{addr_b}:{PORTS['policy_server']}]",
    ]
    host_b = [
        *common,
        f"run_dir={tmp_path / 'b'}",
        f"endpoints.replay_buffer=tcp://{addr_a}:{PORTS['replay_buffer']}",
        f"endpoints.memory_service=tcp://{addr_a}:{PORTS['memory_service']}",
        f"endpoints.policy_servers=[tcp://0.0.0.0:{PORTS['policy_server']}]",
    ]
    for overrides in (host_a, host_b):
        load_config(overrides)  # each host's configuration is valid on its own
    roles = [
        (b, "empo2-policy-server", host_b, "policy_server0"),
        (a, "empo2-memory-service", host_a, "memory_service"),
        (a, "empo2-replay-buffer", host_a, "replay_buffer"),
        (b, "empo2-env-actor", [*host_b, "env_actor.index=0"], "env_actor0"),
        (a, "empo2-learner", host_a, "learner"),
    ]
    # the buffer serves batches only to the learner's token (issue 26), handed over as empo2-run does
    token = {LEARNER_TOKEN_ENV: secrets.token_urlsafe(24)}
    started = {}
    try:
        for ns, command, overrides, name in roles:
            log = tmp_path / f"{name}.log"
            env = token if name in ("replay_buffer", "learner") else None
            started[name] = (
                spawn_command(
                    command, overrides, log, cwd=REPO, exec_prefix=("ip", "netns", "exec", ns), env_extra=env
                ),
                log,
            )
        learner, learner_log = started["learner"]
        deadline = time.monotonic() + TIMEOUT_S
        while learner.poll() is None:
            dead = [n for n, (p, _) in started.items() if p.poll() is not None and n != "learner"]
            assert not dead, "\n".join(started[n][1].read_text()[-2000:] for n in dead)
            assert time.monotonic() < deadline, learner_log.read_text()[-3000:]
            time.sleep(2)
        assert learner.returncode == 0, learner_log.read_text()[-4000:]
        assert re.search(r"step 1: loss=", learner_log.read_text())
        server_log = started["policy_server0"][1]
        while "policy version 1 live" not in server_log.read_text():  # logged as the push is acknowledged
            assert time.monotonic() < deadline, server_log.read_text()[-3000:]
            time.sleep(1)
        assert not (tmp_path / "b" / "checkpoints").exists()  # the weights crossed by socket, not by file
    finally:
        for process, _ in reversed(list(started.values())):
            stop_group(process, grace_s=20)
