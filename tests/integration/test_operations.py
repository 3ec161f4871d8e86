"""The whole pipeline end to end, and its operations, for real, on one run shared by the tests of
this module (in order; the fixture hands each test a run whose roles are up, so any of them also
runs alone): the launcher (profile=e2e, its short episodes; 3 learner steps) starts and
supervises every role as its own process (vLLM policy server, memory service, replay buffer,
ScienceWorld env actors, learner) with the embedded model, every socket under CURVE
(security.curve=true, keys from empo2-keys; this test process uses the evaluation key), and a
real Prometheus (Debian's package) scrapes them through the launcher's file-based discovery with
the rules of deploy/monitoring/rules.yml.

  - every role's target is up in Prometheus
  - the policy server answers a greedy probe with the initial weights
  - an env actor killed with SIGKILL: the role-down alert fires for it, the launcher restarts it
    (empo2_launch_restarts_total in Prometheus), the targets follow the new process
  - the replay buffer killed with SIGKILL comes back (replaying its log)
  - `empo2-run --attach` grows the env actors 1 -> 3 (the new ones' episodes reach the buffer)
    and shrinks them 3 -> 1, with no restart of the learner, buffer or memory service
  - the recording rules give non-zero throughput: episodes, env steps, generated and learner tokens
  - the policy server exports vLLM's engine metrics on its port
  - CURVE guards every server of the running pipeline: a client without CURVE or with an unlisted
    key gets nothing through (each server counts the refused handshakes), and an accepted key of
    the wrong role is refused (wrong_role): an env actor's key takes no batch, the evaluation key
    pushes no weights
  - 200 hostile inputs (testing/fuzz.py) to the live policy server, through CURVE: every one
    answered, generation still served, the server not restarted
  - once the learner has pushed a newer version, the same greedy probe answers differently
  - every dashboard panel reads only metrics the live scrape exports, and every exported family
    is on a panel or deliberately left off (deploy/monitoring/make_dashboard.py)
  - the run still reaches its step target: the servers report the final version, the memory stored
    reflections and returned them into prompts as tips, the checkpoint exists, the summary counts
    the restarts of the roles the tests killed, nothing is left running, and no episode an actor
    delivered is missing from the buffer's log or in it twice

The alerts' `for:` durations are set to 0s in this test's copy of the rules (the durations
themselves are promtool-tested, tests/unit/deploy/test_rules.py); scrape and evaluation every 1s.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth
from prometheus_client.parser import text_string_to_metric_families

from common.model_prep import resolve_model
from common.process import status_mb, stop_group
from deploy.launch import STOPPING
from deploy.monitor import scrape, total
from deploy.monitoring.make_dashboard import PANELS, panel_metric_names, uncovered
from deploy.prometheus import RULES, start_prometheus, wait_ready
from deploy.run_state import kill_role, read_state, wait_for_role
from deploy.status import main as status_main
from protocol import Client
from protocol.messages import BatchRequest, GenerateRequest, GenerateResponse, WeightFile
from protocol.security import Curve, generate_keys, use_curve
from protocol.transport import RemoteError, wait_until_ready
from replay_buffer.buffer import BufferLog, ReplayBuffer
from testing.fuzz import fuzz_endpoint
from testing.harness import LaunchedRun
from tests.helpers import REPO, ping_answered

pytestmark = pytest.mark.e2e
BASE = (
    20100  # metrics.base_port: servers 20100, buffer 20200, memory 20201, launcher 20202, learner 20300, actors 20400..
)
PROMETHEUS = "127.0.0.1:19990"
OVERRIDES = [
    "profile=e2e",
    "endpoints.policy_servers=[tcp://127.0.0.1:19550]",
    "endpoints.replay_buffer=tcp://127.0.0.1:19560",
    "endpoints.memory_service=tcp://127.0.0.1:19570",
    f"metrics.base_port={BASE}",
    "launch.progress_every_s=10",
    "launch.backoff_s=3",
    "launch.num_env_actors=1",  # grown to 3 and shrunk back to 1 while it runs
    "learner.checkpoint_every=1",  # a restarted learner resumes from its last step
    # room for the scaled-up actors: a slot for each of 3 actors at once, and learner steps enough that
    # the run outlasts the live tests (the e2e profile has 1 open group and 2 steps; at 3 steps, once the
    # learner's steps took ~30 s at 4096 micro-batch tokens, the run ended before the CURVE test)
    "replay_buffer.max_open_groups=3",
    "replay_buffer.max_ready_groups=2",
    "learner.total_steps=8",
]
ROLES = ["policy_server0", "memory_service", "replay_buffer", "env_actor0", "learner"]
TIMEOUT_S = 1500


def _api(path: str, **params) -> dict:
    url = f"http://{PROMETHEUS}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]


def _value(expr: str) -> float:
    result = _api("query", query=expr)["result"]
    return sum(float(r["value"][1]) for r in result)


class _LoggedEpisodes(ReplayBuffer):
    """A replay buffer that records every trajectory record the log holds, by episode and actor."""

    def __init__(self, cfg):
        super().__init__(cfg.replay_buffer, {t: [0] for t in cfg.replay_buffer.tasks}, cfg.seed)
        self.added, self.actors = [], set()

    def add(self, traj, nbytes: int = 0) -> bool:
        self.added.append(traj.episode_id)
        self.actors.add(traj.actor_id)
        return super().add(traj, nbytes)


class Run(LaunchedRun):
    """The module's run, under CURVE, with a Prometheus on it; what the tests did to it so far."""

    def __init__(self, run_dir: Path):
        self.keys = run_dir / "keys"
        generate_keys(self.keys)
        rules = run_dir / "rules.yml"
        rules.write_text(re.sub(r"for: \w+", "for: 0s", RULES.read_text()))
        self.prometheus = start_prometheus(run_dir, PROMETHEUS, "1s", [rules], run_dir / "prometheus.log")
        overrides = [*OVERRIDES, "security.curve=true", f"security.keys_dir={self.keys}"]
        super().__init__(overrides, run_dir, TIMEOUT_S, cwd=REPO)
        self.first_answer: GenerateResponse | None = None  # the greedy probe with the initial weights
        self.killed: set[str] = set()  # roles a test killed: each is restarted by the end
        self.actors = {0}  # the env actors that ran (a test grows them to 3)

    def probe(self) -> GenerateResponse:
        """The policy server's greedy answer to a fixed chat prompt (a change shows new weights)."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.cfg.model.name))
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is in the kitchen?"}], tokenize=False, add_generation_prompt=True
        )
        prompt = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int32)
        client = Client(zmq.Context.instance(), self.cfg.endpoints.policy_servers[0], timeout_s=300)
        try:
            wait_until_ready(client, "operations-test", timeout_s=max(self.deadline - time.monotonic(), 1))
            reply = client.call(
                GenerateRequest(
                    request_id=f"probe-{time.time()}", prompt_token_ids=prompt, max_tokens=12, temperature=0.0, seed=0
                )
            )
        finally:
            client.close()
        assert isinstance(reply, GenerateResponse), reply
        return reply

    def targets(self) -> dict[str, dict]:
        # the launcher's target has no `role` label (its metrics have one): keyed by its job
        return {
            t["labels"].get("role", t["labels"]["job"]): t for t in _api("targets", state="active")["activeTargets"]
        }

    def still_running(self, test: str) -> None:
        """Fail at once, not at the suite's deadline, where the run ended before a test that needs it."""
        if not self.alive():
            pytest.fail(f"the run ended before {test}: raise learner.total_steps in OVERRIDES\n{self.tail()}")

    def as_role(self, role: str) -> None:
        """This process's client key from now on (CURVE is process-wide: protocol/security.py)."""
        use_curve(Curve(self.keys, role))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The module's run with its roles up and the policy server's first answer (initial weights)."""
    run = Run(tmp_path_factory.mktemp("operations"))
    run.as_role("evaluation")  # the probes and the fuzzing
    try:
        wait_ready(PROMETHEUS, 60, run.prometheus)
        run.wait_until_up()
        run.first_answer = run.probe()
        yield run
    finally:
        use_curve(None)
        run.stop(grace_s=120)
        stop_group(run.prometheus, grace_s=10)


def test_every_role_is_an_up_target(run):
    def all_up():
        targets = run.targets()
        return all(targets.get(r, {}).get("health") == "up" for r in [*ROLES, "empo2_launch"]) and targets

    targets = run.wait_for("every target up", all_up, poll_s=2)
    assert targets["env_actor0"]["labels"]["job"] == "empo2_env_actor"
    assert targets["learner"]["scrapeUrl"] == f"http://127.0.0.1:{run.cfg.metrics.port('learner')}/metrics"


def test_the_policy_server_answers_with_the_initial_weights(run):
    assert run.first_answer.policy_version == 0 and run.first_answer.token_ids.size > 0


def test_a_killed_env_actor_fires_the_alert_and_comes_back(run):
    before = read_state(run.run_dir)["roles"]["env_actor0"]
    kill_role(run.run_dir, "env_actor0", signal.SIGKILL)
    run.killed.add("env_actor0")

    def firing():
        alerts = _api("alerts")["alerts"]
        return [
            a
            for a in alerts
            if a["labels"]["alertname"] == "EMPO2RoleDown"
            and a["state"] == "firing"
            and a["labels"]["role"] == "env_actor0"
        ]

    (alert,) = run.wait_for("EMPO2RoleDown for env_actor0", firing, poll_s=0.5)
    assert alert["labels"]["job"] == "empo2_env_actor" and alert["labels"]["severity"] == "critical"
    after = wait_for_role(run.run_dir, "env_actor0", before["restarts"] + 1, TIMEOUT_S, run.alive)
    assert after["pid"] != before["pid"] and after["last_exit"] == -signal.SIGKILL
    restarts = after["restarts"]
    run.wait_for(
        "the restart in Prometheus", lambda: _value('empo2_launch_restarts_total{role="env_actor0"}') == restarts
    )
    run.wait_for("env_actor0 up again", lambda: run.targets()["env_actor0"]["health"] == "up", poll_s=2)
    assert "restarted env_actor0" in run.out.read_text()


def test_a_killed_replay_buffer_comes_back(run):
    restarts = read_state(run.run_dir)["roles"]["replay_buffer"]["restarts"]
    kill_role(run.run_dir, "replay_buffer", signal.SIGKILL)
    run.killed.add("replay_buffer")
    wait_for_role(run.run_dir, "replay_buffer", restarts + 1, TIMEOUT_S, run.alive)
    run.wait_for("replay_buffer up again", lambda: run.targets()["replay_buffer"]["health"] == "up", poll_s=2)


def test_env_actors_grow_from_one_to_three_and_shrink_to_one_while_it_runs(run):
    """`empo2-run --attach RUN_DIR launch.num_env_actors=N` against the running launcher: the new
    actors get assignments at once (their episodes reach the buffer), the stopped ones return their
    slots; the learner, buffer and memory service are not restarted by it."""
    before = {n: r["restarts"] for n, r in read_state(run.run_dir)["roles"].items()}
    attach = [sys.executable, "-m", "pipeline", "empo2-run", "--attach", str(run.run_dir)]
    grow = subprocess.run([*attach, "launch.num_env_actors=3"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert grow.returncode == 0, grow.stdout + grow.stderr
    run.actors |= {1, 2}
    for j in (1, 2):
        name = f"env_actor{j}"
        run.wait_for(f"{name} up in Prometheus", lambda n=name: run.targets().get(n, {}).get("health") == "up", 2)
        port = run.cfg.metrics.port("env_actor", j)
        run.wait_for(
            f"an episode of {name}", lambda p=port: total(scrape("127.0.0.1", p), "empo2_env_actor_episodes_total")
        )
    shrink = subprocess.run([*attach, "launch.num_env_actors=1"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert shrink.returncode == 0, shrink.stdout + shrink.stderr
    roles = read_state(run.run_dir)["roles"]
    assert sorted(n for n in roles if n.startswith("env_actor")) == ["env_actor0"]
    # (the learner is left out: a batch request lost with the killed buffer may still time out and
    # restart it, which the supervision covers; scaling sends it nothing)
    for name in ("replay_buffer", "memory_service", "policy_server0"):
        assert roles[name]["restarts"] == before[name], name
    run.wait_for("the targets without env_actor1 and 2", lambda: not {"env_actor1", "env_actor2"} & set(run.targets()))
    log = run.out.read_text()
    assert "scaling up: started env_actor1" in log and "scaling up: started env_actor2" in log
    assert "env_actor2 stopped" in log and "env_actor1 stopped" in log


def test_the_recording_rules_give_throughput(run):
    for rule in ("empo2:episodes:rate1m", "empo2:env_steps:rate1m", "empo2:generated_tokens:rate1m"):
        run.wait_for(rule, lambda rule=rule: _value(rule) > 0)
    run.wait_for("empo2:learner_tokens:rate5m", lambda: _value("empo2:learner_tokens:rate5m") > 0, poll_s=3)


def test_the_dashboard_matches_the_live_scrape(run):
    families: dict[str, list[str]] = {}
    for target in run.targets().values():
        with urllib.request.urlopen(target["scrapeUrl"], timeout=5) as resp:
            for family in text_string_to_metric_families(resp.read().decode()):
                suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
                families[family.name] = [family.name + s for s in suffixes]
    live = {s for samples in families.values() for s in samples} | {"up"}
    for title, _, exprs in PANELS:
        for expr in exprs:
            names, regexes = panel_metric_names(expr)
            # the evaluator role runs only with eval.every_steps > 0, which this run does not set
            names = {n for n in names if not n.startswith("empo2_evaluator_")}
            assert names <= live, f"panel {title!r} reads {names - live}, which no process exports"
            for regex in regexes:
                assert any(re.fullmatch(regex, s) for s in live), f"panel {title!r}: nothing matches {regex}"
    # prometheus_client's `<counter>_created` timestamps parse as families of their own: not metrics of ours
    assert uncovered({f: s for f, s in families.items() if not f.endswith("_created")}) == set()


def test_the_policy_server_exports_vllm_engine_metrics(run):
    server = scrape(run.cfg.metrics.host, run.cfg.metrics.port("policy_server", 0))
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert total(server, name) >= 0 and any(k.startswith(name) for k in server), name
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count"):
        assert total(server, name) > 0, name
    assert _value("sum(max_over_time(vllm:generation_tokens_total[30m]))") > 0  # and Prometheus has them


def test_curve_guards_every_server_of_the_running_pipeline(run):
    run.still_running("curve guards every server of the running pipeline")
    servers = {
        "policy_server": run.cfg.endpoints.policy_servers[0],
        "replay_buffer": run.cfg.endpoints.replay_buffer,
        "memory_service": run.cfg.endpoints.memory_service,
    }
    server_key = zmq.auth.load_certificate(str(run.keys / "server.key"))[0]
    public, secret = zmq.curve_keypair()  # a key pair no one authorized
    unlisted = {zmq.CURVE_SERVERKEY: server_key, zmq.CURVE_PUBLICKEY: public, zmq.CURVE_SECRETKEY: secret}
    for kind, endpoint in servers.items():
        failures = f"empo2_{kind}_handshake_failures_total"
        before = run.metric(kind, failures)
        assert not ping_answered(endpoint, {}, 2000), f"{kind} answered a client without CURVE"
        assert not ping_answered(endpoint, unlisted, 2000), f"{kind} answered an unlisted key"
        run.wait_for(
            f"{kind}'s refused handshakes counted",
            lambda k=kind, f=failures, n=before: run.metric(k, f) >= n + 2,
        )

    def refused(role: str, endpoint: str, msg) -> str:
        run.as_role(role)
        client = Client(zmq.Context.instance(), endpoint, timeout_s=30)
        try:
            with pytest.raises(RemoteError) as exc:
                client.call(msg)
            return exc.value.reason
        finally:
            client.close()
            run.as_role("evaluation")

    batch = BatchRequest(learner_version=0, num_groups=1, max_staleness=1)
    assert refused("env_actor", servers["replay_buffer"], batch) == "wrong_role"
    push = WeightFile(version=99, path="/dev/shm/empo2-intruder.safetensors", checksum="0" * 32)
    assert refused("evaluation", servers["policy_server"], push) == "wrong_role"
    for kind in ("replay_buffer", "policy_server"):
        assert run.metric(kind, f'empo2_{kind}_messages_rejected_total{{reason="wrong_role"}}') >= 1


def test_the_live_policy_server_answers_hostile_inputs_and_keeps_serving(run):
    run.still_running("the live policy server answers hostile inputs and keeps serving")
    before = read_state(run.run_dir)["roles"]["policy_server0"]
    result = fuzz_endpoint(
        run.cfg.endpoints.policy_servers[0],
        "policy_server",
        200,
        100,
        seed=3,
        alive=lambda: read_state(run.run_dir)["roles"]["policy_server0"]["pid"] == before["pid"],
        memory_mb=lambda: status_mb(before["pid"]),
        # the server (niced: pipeline.rollout_nice) may wait behind a learner step on 2 cores: once
        # (2026-12-06) an input went 15 s unanswered while the next valid request was answered
        reply_timeout_s=60,
    )
    assert not result["crashed"] and result["inputs_sent"] == 200, result
    assert result["replies"].get("no_reply", 0) == 0 and result["valid_checks"] == {"ok": 3}, result
    assert read_state(run.run_dir)["roles"]["policy_server0"]["restarts"] == before["restarts"]


def test_a_weight_update_changes_the_greedy_answer(run):
    port = run.cfg.metrics.port("policy_server", 0)
    run.wait_for(
        "a weight update on the policy server",
        lambda: scrape(run.cfg.metrics.host, port).get("empo2_policy_server_policy_version", -1) > 0,
        poll_s=2,
    )
    before, after = run.first_answer, run.probe()
    assert after.policy_version > before.policy_version
    assert not (
        np.array_equal(after.token_ids, before.token_ids) and np.allclose(after.logprobs, before.logprobs, atol=1e-6)
    )


def test_the_run_reaches_its_step_target(run, capsys):
    rc = run.wait()
    output = run.out.read_text()
    assert rc == 0, output[-6000:]
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["outcome"] == "done"
    assert summary["policy_version"] == run.cfg.learner.total_steps
    assert all(summary["restarts"][role] >= 1 for role in run.killed), summary["restarts"]
    print(json.dumps(summary, indent=1))
    version = summary["policy_version"]
    assert summary["learner_steps"] == version and summary["server_versions_at_end"] == [version]
    assert summary["memory_entries"] > 0 and summary["reflections"] > 0  # the memory stored tips...
    assert summary["memories_retrieved"] > 0 and summary["tips_shown"] > 0  # ...and returned them into prompts
    assert (run.run_dir / "checkpoints" / f"step_{version:06d}" / "model" / "model.safetensors").exists()
    logs = {p.stem: p.read_text(errors="replace") for p in (run.run_dir / "logs").glob("*.log")}
    assert f"step {version}: loss=" in logs["learner"]
    assert f"policy version {version} live" in logs["policy_server0"]
    assert "reflection stored" in logs["memory_service"]
    state = read_state(run.run_dir)
    assert not [r for r in state["roles"].values() if r["up"]]

    # a clean stop is clean (issue 26): after the launcher's stop line, no role's log holds a traceback
    # or a leaked-resource warning, each role exited 0, and empo2-status says the run finished
    for name, text in logs.items():
        stop = text.rfind(STOPPING)
        if stop >= 0:  # the learner ended by itself, before the stop
            after = text[stop:]
            assert not re.search(r"Traceback|Exception ignored|leaked", after), f"{name}'s stop:\n{after[-4000:]}"
    assert {name: r["exit"] for name, r in state["roles"].items() if r["exit"] != 0} == {}
    capsys.readouterr()
    assert status_main([str(run.run_dir)]) == 0
    screen = capsys.readouterr().out
    assert "run finished: done, exit status 0" in screen and f"final policy version {version}" in screen, screen

    # no episode lost or duplicated across the kills and the scaling: every episode an actor logged
    # (after the buffer's Ack) is in the buffer's log once, and every actor that ran has episodes there
    logged = set()
    for j in run.actors:
        logged |= set(
            re.findall(r"episode ([0-9a-f]+) \S+/\d+ mode=", (run.run_dir / "logs" / f"env_actor{j}.log").read_text())
        )
    buffer = _LoggedEpisodes(run.cfg)
    BufferLog.replay(run.run_dir / run.cfg.replay_buffer.log_file, buffer)
    assert len(buffer.added) == len(set(buffer.added)), "an episode is twice in the buffer log"
    assert all(any(e.startswith(short) for e in buffer.added) for short in logged), "a delivered episode is missing"
    assert {a.split(".")[0] for a in buffer.actors} == {f"actor{j}" for j in run.actors}
    for role in state["roles"].values():  # every process the launcher ever started is gone
        with pytest.raises(ProcessLookupError):
            os.kill(role["pid"], 0)
