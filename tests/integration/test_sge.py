"""SGE in the whole pipeline (preset=empo2_sge on the e2e profile: EMPO2's tips in every group, SGE's
strategy before each action): every turn of every episode parses into the actor's opening tag, the
sampled strategy at its member's temperature (a group's members spread over the configured range), the
glue and the sampled action at the actor's temperature, and the mask marks exactly the sampled tokens;
the memory service keeps the episodes' strategies, the groups that open later are shown them, every
member of a group the same reflection; the learner trains to its step target."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import numpy as np
import pytest
from transformers import AutoTokenizer

from actors.env_actor.strategy import STRATEGY_CLOSE, STRATEGY_OPEN
from common.model_prep import resolve_model
from replay_buffer.buffer import BufferLog
from tests.helpers import run_to_its_end

pytestmark = pytest.mark.e2e
BASE = 24100  # metrics.base_port: server 24100, buffer 24200, memory 24201, launcher 24202, learner 24300, ...
OVERRIDES = [
    "profile=e2e",
    "preset=empo2_sge",
    "sge.max_strategy_tokens=24",  # short strategies: the run stays short
    "endpoints.policy_servers=[tcp://127.0.0.1:23550]",
    "endpoints.replay_buffer=tcp://127.0.0.1:23560",
    "endpoints.memory_service=tcp://127.0.0.1:23570",
    f"metrics.base_port={BASE}",
    "launch.progress_every_s=15",
]
TIMEOUT_S = 1200


def test_every_turn_is_a_strategy_then_an_action_and_later_groups_see_the_earlier_strategies(tmp_path):
    run, summary = run_to_its_end(OVERRIDES, tmp_path / "run", TIMEOUT_S)
    cfg = run.cfg
    trajectories, _, found = BufferLog.read(cfg.run_path(cfg.replay_buffer.log_file))
    assert trajectories and not found.skipped
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.model.name))
    size = cfg.replay_buffer.group_size
    reflections: dict[str, set[str]] = {}
    for t in trajectories:
        assert t.strategy_temperature == pytest.approx(cfg.sge.strategy_temperature(t.slot, size))
        for i in range(t.num_turns):
            response, mask, temps = t.turn_response(i), t.turn_response_mask(i), t.turn_temperatures(i)
            text = tokenizer.decode(response.tolist())
            assert text.startswith(STRATEGY_OPEN) and STRATEGY_CLOSE in text, text  # replan_every 1: every turn
            assert t.strategies[i] in " ".join(text.split())  # "" if the model closed it at once
            glue = tokenizer.decode(response[mask == 0].tolist())
            assert glue.startswith(STRATEGY_OPEN) and glue.removeprefix(STRATEGY_OPEN) in (
                "",
                "\n",
                STRATEGY_CLOSE + "\n",
            )
            # sampled tokens: the strategy's at the member's temperature, then the action's at the actor's
            sampled_at = temps[mask == 1].astype(np.float64)
            member, actor = t.strategy_temperature, cfg.env_actor.temperature
            assert np.all(np.isclose(sampled_at, member, atol=1e-6) | np.isclose(sampled_at, actor, atol=1e-6))
            assert float(sampled_at[-1]) == pytest.approx(actor)
        prompt = tokenizer.decode(t.turn_prompt(0).tolist())
        shown = prompt.split("<reflection>", 1)[1].split("</reflection>", 1)[0] if "<reflection>" in prompt else ""
        reflections.setdefault(t.group_id, set()).add(shown)
    assert any(s for t in trajectories for s in t.strategies)
    assert all(len(shown) == 1 for shown in reflections.values()), reflections  # one per group
    assert any(shown != {""} for shown in reflections.values()), reflections  # later groups see earlier ones
    with closing(sqlite3.connect(cfg.run_path(cfg.memory_service.db_file))) as db:
        stored = db.execute("SELECT COUNT(*) FROM strategies").fetchone()[0]
    assert 0 < stored <= len(trajectories)
