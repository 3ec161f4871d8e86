"""`empo2-eval` for real: a vLLM policy server and ScienceWorld, 1 task x 2 test variations x 1
episode with a 2-step limit. The command plays against the server through a recording relay
(eval.reuse_servers), and a socket bound at the memory service's endpoint records anything sent
there. Checked: only the task's first two test variations are played, no memory request is sent,
every generation request samples at 0.4, the table and the JSON are written, and a run stopped
after its first episode resumes without replaying it."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest
import zmq

from common.config import EnvConfig
from common.process import spawn_command
from common.scienceworld import ScienceWorld
from protocol import Client
from protocol.messages import GenerateRequest
from protocol.transport import bind_router, recv_request, send_reply, wait_until_ready
from tests.helpers import REPO

pytestmark = pytest.mark.integration
TASK = "find-animal"
SERVER, RELAY, MEMORY = "tcp://127.0.0.1:15550", "tcp://127.0.0.1:15551", "tcp://127.0.0.1:15570"
METRICS_BASE = 16000  # 16000..16999: disjoint from the other tests' metrics blocks and from the endpoints above
RUN_S = 600


class Relay:
    """Answers the evaluation's requests by forwarding them to the real server, recording each;
    while `hold` is set it records and forwards nothing (the evaluation waits mid-episode)."""

    def __init__(self, listen: str, server: str | None):
        self.ctx = zmq.Context.instance()
        self.listen, self.server = listen, server
        self.requests: list = []
        self.hold = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sock = bind_router(self.ctx, self.listen)
        upstream = Client(self.ctx, self.server, timeout_s=300) if self.server else None
        try:
            while not self._stop.is_set():
                if not sock.poll(100):
                    continue
                request = recv_request(sock)
                self.requests.append(request.message)
                if upstream is not None and not self.hold.is_set():
                    send_reply(sock, request.identity, upstream.call(request.message))
        finally:
            sock.close(linger=0)
            if upstream is not None:
                upstream.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _eval(tmp_path, name: str) -> subprocess.Popen:
    overrides = [
        "profile=e2e",
        f"run_dir={tmp_path}",
        f"eval.tasks=[{TASK}]",
        "eval.variations=2",
        "eval.episodes=1",
        "eval.envs=1",  # one env: the episodes end one after the other, so the stop lands between them
        "eval.reuse_servers=true",
        f"endpoints.policy_servers=[{RELAY}]",
        f"endpoints.memory_service={MEMORY}",
        f"metrics.base_port={METRICS_BASE}",
        "env.max_steps=2",
    ]
    return spawn_command("empo2-eval", overrides, tmp_path / f"{name}.out", cwd=REPO)


def _wait(proc: subprocess.Popen, out, timeout_s: float) -> str:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"no result within {timeout_s}s:\n" + out.read_text(errors="replace")[-5000:])
    return out.read_text(errors="replace")


def test_eval_test_variations_no_memory_resume(start_role, tmp_path):
    server = start_role(
        "empo2-policy-server",
        [
            "profile=e2e",
            f"endpoints.policy_servers=[{SERVER}]",
            f"metrics.base_port={METRICS_BASE}",
            f"run_dir={tmp_path}",
        ],
        "policy_server",
    )
    probe = Client(zmq.Context.instance(), SERVER, timeout_s=60)
    try:
        wait_until_ready(probe, "test", timeout_s=600)
    except TimeoutError:
        pytest.fail("policy server did not start:\n" + server.log()[-3000:])
    finally:
        probe.close()
    relay, memory = Relay(RELAY, SERVER), Relay(MEMORY, None)
    episodes = tmp_path / "eval" / "base" / "episodes.jsonl"
    try:
        # first run: stopped once its first episode is recorded, while the second waits on the relay
        first = _eval(tmp_path, "first")
        deadline = time.monotonic() + RUN_S
        while not (episodes.exists() and episodes.read_text().count("\n") >= 1):
            assert first.poll() is None, (tmp_path / "first.out").read_text()[-5000:]
            assert time.monotonic() < deadline, "no episode recorded in time"
            time.sleep(0.2)
        relay.hold.set()
        first.send_signal(signal.SIGTERM)
        output = _wait(first, tmp_path / "first.out", 120)
        assert first.returncode == 130, output[-3000:]
        [played_first] = episodes.read_text().splitlines()

        relay.hold.clear()
        second = _eval(tmp_path, "second")
        output = _wait(second, tmp_path / "second.out", RUN_S)
        assert second.returncode == 0, output[-5000:]
    finally:
        relay.close()
        memory.close()

    assert "1 already in" in output and "1 to play" in output
    lines = episodes.read_text().splitlines()
    assert lines[0] == played_first and len(lines) == 2  # the finished episode was not played again
    records = [json.loads(line) for line in lines]

    env = ScienceWorld(EnvConfig().simplification)
    try:
        test_variations, train_variations = env.test_variations(TASK), env.train_variations(TASK)
    finally:
        env.close()
    assert sorted(r["variation"] for r in records) == sorted(test_variations[:2])
    assert not {r["variation"] for r in records} & set(train_variations)
    assert all(r["turns"] <= 2 for r in records)

    assert memory.requests == []  # the memory service's endpoint heard nothing
    generations = [m for m in relay.requests if isinstance(m, GenerateRequest)]
    assert generations and all(m.temperature == pytest.approx(0.4) for m in generations)

    out = tmp_path / "eval" / "base"
    report = json.loads((out / "results.json").read_text())
    assert report["complete"] and report["memory"] is False and report["temperature"] == 0.4
    [row] = report["tasks"]
    assert (row["task"], row["variations"], row["episodes"]) == (TASK, 2, 2)
    assert row["score_mean"] == pytest.approx(sum(r["score"] for r in records) / 2)
    table = (out / "table.md").read_text()
    assert f"| {TASK} | 2 x 1 |" in table and "100.0 ± 0.0 | 72.4 ± 6.8 |" in table  # ours beside the paper's
    assert (out / "results.csv").read_text().startswith("task,variations,episodes,score_mean")
