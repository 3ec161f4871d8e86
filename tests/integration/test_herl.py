"""HeRL in the whole pipeline (preset=empo2_herl on the e2e profile: EMPO2's tips in every group, HeRL's
guided revisions of the unsolved ones): the replay buffer holds an unsolved group, its tied-best members
are replayed as guided episodes with the guidance in their prompts, the group closes with a revision or
a copy of its best original in one slot, and the learner trains on it to its step target."""

from __future__ import annotations

import re

import pytest
from transformers import AutoTokenizer

from common.model_prep import resolve_model
from protocol.messages import GUIDED
from replay_buffer.buffer import BufferLog
from tests.helpers import run_to_its_end

pytestmark = pytest.mark.e2e
BASE = 18100  # metrics.base_port: server 18100, buffer 18200, memory 18201, launcher 18202, learner 18300, ...
OVERRIDES = [
    "profile=e2e",
    "preset=empo2_herl",
    "herl.max_candidates=1",  # one guided episode per unsolved group: the run stays short
    "endpoints.policy_servers=[tcp://127.0.0.1:17550]",
    "endpoints.replay_buffer=tcp://127.0.0.1:17560",
    "endpoints.memory_service=tcp://127.0.0.1:17570",
    f"metrics.base_port={BASE}",
    "launch.progress_every_s=15",
]
TIMEOUT_S = 1200


def test_an_unsolved_group_is_revised_with_guidance_and_trained_on(tmp_path):
    run, summary = run_to_its_end(OVERRIDES, tmp_path / "run", TIMEOUT_S)
    trajectories, _, found = BufferLog.read(run.cfg.run_path(run.cfg.replay_buffer.log_file))
    assert not found.skipped
    guided = [t for t in trajectories if t.mode == GUIDED]
    assert guided, [(t.mode, t.score) for t in trajectories]  # nothing is solved on this model
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(run.cfg.model.name))
    for t in guided:
        assert t.num_turns >= 1 and t.slot >= run.cfg.replay_buffer.group_size  # a guided slot of its own
        assert float(t.temperatures[0]) == pytest.approx(run.cfg.herl.temperature)
        turn, start, end = t.tip_spans[0].tolist()  # the guidance: the first span, in the system part
        assert turn == 0 and tokenizer.decode(t.turn_prompt(0)[start:end].tolist()).startswith("\n<guidance>")
    closed = re.findall(
        r"guided group \S+ closed: (\d+) of (\d+) revisions in",
        (run.run_dir / "logs" / "replay_buffer.log").read_text(),
    )
    assert closed and all(int(got) <= int(of) for got, of in closed)
