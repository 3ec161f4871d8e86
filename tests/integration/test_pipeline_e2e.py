"""The whole pipeline, for real: five roles as separate processes (vLLM policy server, memory
service, replay buffer, two ScienceWorld env actors, learner) started by the launcher with the
embedded model, checked from the processes' own outputs and metrics, and always torn down."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import numpy as np
import pytest
import zmq

from common.model_prep import resolve_model
from common.process import spawn_role
from deploy.monitor import scrape
from pipeline.config import load_config
from protocol import Client
from protocol.messages import GenerateRequest, GenerateResponse
from protocol.transport import wait_until_ready
from tests.integration.conftest import REPO

pytestmark = pytest.mark.e2e
TIMEOUT_S = 1500


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _probe(client: Client, prompt: np.ndarray) -> GenerateResponse:
    return client.call(
        GenerateRequest(
            request_id=f"probe-{time.time()}", prompt_token_ids=prompt, max_tokens=12, temperature=0.0, seed=0
        )
    )


def test_pipeline_end_to_end(tmp_path):
    overrides = ["profile=e2e", f"run_dir={tmp_path}", "launch.progress_every_s=10"]
    cfg = load_config(overrides)
    out_path = tmp_path / "launch.out"
    launcher = spawn_role("deploy.launch", overrides, out_path, cwd=REPO)
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.model.name))
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is in the kitchen?"}], tokenize=False, add_generation_prompt=True
        )
        prompt = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int32)
        client = Client(zmq.Context.instance(), cfg.endpoints.policy_servers[0], timeout_s=300)
        wait_until_ready(client, "e2e-test", timeout_s=900)
        before = _probe(client, prompt)  # greedy output of the initial policy

        # once the learner has pushed a newer version, the same greedy prompt must change
        metrics_port = cfg.metrics.port("policy_server", 0)
        deadline = time.monotonic() + TIMEOUT_S
        while (
            scrape(cfg.metrics.host, metrics_port).get("empo2_policy_server_policy_version", -1)
            <= before.policy_version
        ):
            assert launcher.poll() is None, "launcher ended before any weight update:\n" + out_path.read_text()[-4000:]
            assert time.monotonic() < deadline, "no weight update in time"
            time.sleep(2)
        after = _probe(client, prompt)
        client.close()
        assert after.policy_version > before.policy_version
        assert not (
            np.array_equal(after.token_ids, before.token_ids)
            and np.allclose(after.logprobs, before.logprobs, atol=1e-6)
        )

        rc = launcher.wait(timeout=max(deadline - time.monotonic(), 1))
        output = out_path.read_text()
        assert rc == 0, output[-6000:]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(timeout=60)

    summary = json.loads((tmp_path / "summary.json").read_text())
    print(json.dumps(summary, indent=1))
    assert summary["outcome"] == "done"
    assert summary["learner_steps"] >= 2 and summary["policy_version"] == summary["learner_steps"]
    assert summary["server_versions_at_end"] == [summary["policy_version"]]  # servers report the new version
    assert summary["episodes"] >= 4  # two complete groups of two reached the buffer
    assert summary["memory_entries"] > 0 and summary["reflections"] > 0  # the memory stored tips...
    assert summary["memories_retrieved"] > 0 and summary["tips_shown"] > 0  # ...and returned them into prompts
    assert (tmp_path / "checkpoints" / f"step_{summary['policy_version']:06d}" / "model.safetensors").exists()

    logs = {p.stem: p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log")}
    assert re.search(r"step 2: loss=", logs["learner"])
    assert f"policy version {summary['policy_version']} live" in logs["policy_server0"]
    assert "reflection stored" in logs["memory_service"]
    assert sum("episode " in logs[f"env_actor{j}"] for j in range(2)) == 2  # both actors played

    # teardown: every process the launcher started is gone (their groups were killed)
    pids = [int(p) for p in re.findall(r"started \w+ \(pid (\d+)\)", output)]
    assert len(pids) == 6
    assert not [p for p in pids if _alive(p)]
