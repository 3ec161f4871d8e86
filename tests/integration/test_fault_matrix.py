"""The fault matrix: while one supervised pipeline trains (profile=e2e, the CPU profile's roles with
short episodes, here with two policy servers), first two roles hang (SIGSTOP, then SIGCONT):

  - the memory service: the env actors' retrievals time out and their turns go on without tips
    (counted as memory fallbacks), episodes keep coming
  - a policy server: the env actors time out on it and fail over to the other one, the learner
    steps on (its pushes are in the background) with the hung server behind; once it runs again it
    catches up with the learner's version

then each role is killed with SIGKILL in turn — an env actor, the memory service, the policy
server, the replay buffer, the learner — and the launcher brings it back. Then:

  - training reaches its step target; the killed learner resumed from its newest checkpoint
  - every episode an actor saw acknowledged is in the buffer's log exactly once, and no group is
    recorded as used (confirmed) twice
  - the memory entries the service counted as stored before its kill are still there after it
  - no process is left behind (vLLM engine cores and workers, ScienceWorld JVMs) and nothing in
    /dev/shm

One run for the whole module, the kills in order (each test waits for the role to be back); the
fixture hands each test a run that has taken its first learner step, so any of them also runs alone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from deploy.monitor import scrape
from deploy.run_state import kill_role, read_state, wait_for_role
from learner.checkpoint import list_checkpoints
from testing.harness import LaunchedRun, episode_audit, leftover_processes
from tests.helpers import REPO

# long: ~18 min on 2 cores, run by `make test-long`; `make test` keeps its short variants: the env actor
# and replay buffer kills of test_operations.py, the memory service's kill -9 in test_memory_durability.py
pytestmark = [pytest.mark.e2e, pytest.mark.long]
BASE = 12100  # metrics.base_port: servers 12100, buffer 12200, memory 12201, launcher 12202, learner 12300, ...
# the learner is killed after step 2 and resumes; the steps after it keep the run going until every
# kill has been checked (with 3 ready groups the learner can take 3 steps without new episodes: at 4
# steps the run ended before the restarted policy server had generated)
TOTAL_STEPS = 8
OVERRIDES = [
    "profile=e2e",
    "endpoints.policy_servers=[tcp://127.0.0.1:11550,tcp://127.0.0.1:11551]",
    # a hung role is found by these timeouts (the defaults, minutes, suit a slow CPU start-up)
    "env_actor.generate_timeout_s=60",
    "learner.push_timeout_s=45",
    "learner.push_attempts=8",
    # room for the actors to play on while the learner's push to a hung server stalls (minutes): with
    # the profile's one open and one ready group they stop too, and none asks the hung server
    "replay_buffer.max_open_groups=3",
    "replay_buffer.max_ready_groups=3",
    "endpoints.replay_buffer=tcp://127.0.0.1:11560",
    "endpoints.memory_service=tcp://127.0.0.1:11570",
    f"metrics.base_port={BASE}",
    f"learner.total_steps={TOTAL_STEPS}",
    "learner.checkpoint_every=1",  # the learner's kill loses at most the step it was taking
    "launch.progress_every_s=15",
    "launch.backoff_s=2",
    "launch.restart_budget=3",
]
TIMEOUT_S = 1800


class Run(LaunchedRun):
    """The module's run; what was there before it, and the roles the tests killed."""

    def __init__(self, run_dir: Path):
        self.processes_before, self.shm_before = set(leftover_processes()), set(os.listdir("/dev/shm"))
        super().__init__(OVERRIDES, run_dir, TIMEOUT_S, cwd=REPO)
        self.killed: set[str] = set()  # each is restarted by the end

    def actors_metric(self, name: str) -> float:
        return sum(self.metric("env_actor", name, j) for j in range(self.cfg.launch.num_env_actors))

    def hang(self, role: str, sig: int) -> None:
        """SIGSTOP / SIGCONT a role's whole process group (its vLLM engine core too)."""
        os.killpg(read_state(self.run_dir)["roles"][role]["pid"], sig)

    def kill_and_wait(self, role: str) -> dict:
        before = read_state(self.run_dir)["roles"][role]
        kill_role(self.run_dir, role, signal.SIGKILL)
        self.killed.add(role)
        after = wait_for_role(self.run_dir, role, before["restarts"] + 1, TIMEOUT_S, self.alive)
        assert after["pid"] != before["pid"] and after["last_exit"] == -signal.SIGKILL
        return after


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = Run(tmp_path_factory.mktemp("faults"))
    try:
        run.wait_for("the first learner step", lambda: run.metric("learner", "empo2_learner_steps_total") >= 1, 2)
        yield run
    finally:
        run.stop(grace_s=180)


def test_a_hung_memory_service_is_gone_around_without_tips(run):
    fallbacks = run.actors_metric("empo2_env_actor_memory_fallbacks_total")
    run.hang("memory_service", signal.SIGSTOP)
    try:
        steps = run.actors_metric("empo2_env_actor_env_steps_total")
        run.wait_for(
            "turns without tips", lambda: run.actors_metric("empo2_env_actor_memory_fallbacks_total") > fallbacks + 2
        )
        run.wait_for("env steps meanwhile", lambda: run.actors_metric("empo2_env_actor_env_steps_total") > steps + 2)
    finally:
        run.hang("memory_service", signal.SIGCONT)
    run.wait_for(
        "the memory service answering again",
        lambda: scrape(run.cfg.metrics.host, run.cfg.metrics.port("memory_service")),
    )


def test_a_hung_policy_server_is_failed_over_and_does_not_hold_the_learner(run):
    """The learner pushes in the background (learner.background_push, the default): it steps on past
    a hung server, which falls behind, and catches up with the newest version once it runs again."""
    learner_log = run.run_dir / "logs" / "learner.log"
    server1 = run.cfg.endpoints.policy_servers[1]
    lag = 'empo2_learner_server_version_lag{server="' + server1 + '"}'
    timeouts = run.actors_metric('empo2_env_actor_errors_total{where="timeout"}')
    run.hang("policy_server1", signal.SIGSTOP)
    try:
        run.wait_for(
            "an env actor's generation timing out on the hung server",
            lambda: run.actors_metric('empo2_env_actor_errors_total{where="timeout"}') > timeouts,
            poll_s=2,
        )
        tokens = run.metric("policy_server", "empo2_policy_server_generated_tokens_total", 0)
        run.wait_for(
            "generation going on at the other server",
            lambda: run.metric("policy_server", "empo2_policy_server_generated_tokens_total", 0) > tokens,
            poll_s=2,
        )
        run.wait_for(
            "the learner stepping on with the hung server behind",
            lambda: run.metric("learner", lag) >= 1,
            poll_s=2,
        )
    finally:
        run.hang("policy_server1", signal.SIGCONT)
    learner_version = run.metric("learner", "empo2_learner_policy_version")
    run.wait_for(
        "the hung server catching up with the learner",
        lambda: run.metric("policy_server", "empo2_policy_server_policy_version", 1) >= learner_version,
        poll_s=2,
    )
    assert "PushStalled" not in learner_log.read_text()  # never held, never given up


def test_a_killed_env_actor_comes_back(run):
    run.kill_and_wait("env_actor0")


def test_a_killed_memory_service_keeps_its_entries(run):
    entries = run.wait_for(
        "a stored memory entry", lambda: run.metric("memory_service", "empo2_memory_service_entries"), poll_s=2
    )
    run.kill_and_wait("memory_service")
    # the service reopens its database: every entry counted before is there (reflections queued
    # then are resumed from the database too, so the count can only grow)
    assert (
        run.wait_for(
            "the memory service's metrics", lambda: run.metric("memory_service", "empo2_memory_service_entries") or None
        )
        >= entries
    )


def test_a_killed_policy_server_comes_back_and_serves(run):
    tokens = run.metric("policy_server", "empo2_policy_server_generated_tokens_total")
    run.kill_and_wait("policy_server0")
    run.wait_for(
        "generation on the restarted server",
        lambda: run.metric("policy_server", "empo2_policy_server_generated_tokens_total") > 0,
        poll_s=2,
    )
    assert tokens > 0


def test_a_killed_replay_buffer_comes_back(run):
    run.kill_and_wait("replay_buffer")
    run.wait_for("the buffer's replay", lambda: run.metric("replay_buffer", "empo2_replay_buffer_log_records_replayed"))


def test_a_killed_learner_resumes_from_its_newest_checkpoint(run):
    steps = run.wait_for(
        "a second learner step", lambda: run.metric("learner", "empo2_learner_steps_total") >= 2 or None, poll_s=1
    )
    assert steps
    log_path = run.run_dir / "logs" / "learner.log"
    resumes = log_path.read_text().count("resumed from")
    restarts = read_state(run.run_dir)["roles"]["learner"]["restarts"]
    pid = kill_role(run.run_dir, "learner", signal.SIGKILL)
    run.killed.add("learner")
    time.sleep(1)  # dead: its checkpoints stay as they are until the restarted learner steps
    newest = list_checkpoints(run.run_dir / "checkpoints")[-1]
    wait_for_role(run.run_dir, "learner", restarts + 1, TIMEOUT_S, run.alive)
    run.wait_for("the learner's resume", lambda: log_path.read_text().count("resumed from") > resumes, poll_s=1)
    path, version = re.findall(r"resumed from (\S+) at policy version (\d+)", log_path.read_text())[-1]
    assert Path(path).name == newest.name and int(version) >= 1, (path, newest, pid)


def test_training_reaches_its_target_and_nothing_is_lost_or_left(run):
    rc = run.wait()
    output = run.out.read_text()
    assert rc == 0, output[-6000:]
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["outcome"] == "done" and summary["policy_version"] == TOTAL_STEPS, summary
    for role in run.killed:
        assert summary["restarts"][role] >= 1, summary["restarts"]
    assert summary["restarts"]["policy_server1"] == 0  # hung and resumed, never restarted
    assert summary["server_versions_at_end"] == [TOTAL_STEPS, TOTAL_STEPS]

    # the buffer's log against what the actors were told: each acknowledged episode exactly once
    audit = episode_audit(run.cfg)
    assert audit["acknowledged"] and audit["logged"], audit
    assert not (audit["logged_twice"] or audit["groups_used_twice"] or audit["acknowledged_not_logged"]), audit
    assert not audit["skipped_records"], audit

    # nothing left behind by the kills: processes, shared memory
    time.sleep(2)
    left = {pid: cmd for pid, cmd in leftover_processes().items() if pid not in run.processes_before}
    assert not left, left
    assert set(os.listdir("/dev/shm")) <= run.shm_before
