"""SGE's turn (actors/env_actor/strategy.py) with the real tokenizer of the embedded model and scripted
generations: the response is the opening tag, the strategy, the glue and the action, the mask covers
exactly the sampled tokens, each sampled token keeps its temperature; and an env worker against stub
servers: the strategy requests at each member's temperature, stopping at the closing tag, the actions at
the actor's, one reflection for the whole group, the opening strategy reported to the memory."""

from __future__ import annotations

import numpy as np
import pytest

from actors.env_actor.episode import EpisodeRunner
from actors.env_actor.strategy import (
    STRATEGY_CLOSE,
    STRATEGY_INSTRUCTIONS,
    STRATEGY_OPEN,
    Strategist,
    format_reflection_block,
)
from actors.env_actor.worker import EnvWorker
from common.model_prep import resolve_model
from protocol.messages import (
    ON_POLICY,
    Ack,
    Assignment,
    EpisodeReport,
    GenerateRequest,
    GenerateResponse,
    Ping,
    Pong,
    StrategyQuery,
    StrategyResult,
)
from tests.unit.actors.test_env_worker import PlainPrompts, ScriptedEnv, _cfg


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model("embedded:SmolLM2-135M-Instruct"))


def ids(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)


def answer(tokenizer, text: str, temperature: float, logprob: float, version: int = 3) -> GenerateResponse:
    token_ids = ids(tokenizer, text)
    return GenerateResponse(
        request_id="r",
        token_ids=token_ids,
        logprobs=np.full(len(token_ids), logprob, np.float32),
        text=text.split(STRATEGY_CLOSE)[0].rstrip("\n"),  # vLLM's text stops before the stop string
        policy_version=version,
        finish_reason="stop",
        temperature=temperature,
    )


@pytest.mark.parametrize(
    "strategy_text, glue",
    [
        ("go to the kitchen first" + STRATEGY_CLOSE, "\n"),  # closed by the model: a line break before the action
        ("go to the kitchen and then", STRATEGY_CLOSE + "\n"),  # cut at the cap: closed by the actor
    ],
)
def test_the_response_is_tag_strategy_glue_action_and_the_mask_marks_what_was_sampled(tokenizer, strategy_text, glue):
    strategist = Strategist(tokenizer)
    prompt = ids(tokenizer, "<|im_start|>user\nYou are in a hallway.<|im_end|>\n<|im_start|>assistant\n")
    asked = []

    def strategy(p, seed):
        asked.append(("strategy", p, seed))
        return answer(tokenizer, strategy_text, 1.4, -2.0, version=4)

    def action(p, seed):
        asked.append(("action", p, seed))
        return answer(tokenizer, "open door to kitchen\n", 0.7, -0.5)

    out = strategist.turn(prompt, 9, strategy, action)
    opening, sampled, glue_ids, acted = (
        ids(tokenizer, STRATEGY_OPEN), ids(tokenizer, strategy_text), ids(tokenizer, glue), ids(tokenizer, "open door to kitchen\n")
    )  # fmt: skip
    assert out.response.token_ids.tolist() == [*opening, *sampled, *glue_ids, *acted]
    # the action is asked on the prompt, the tag, the strategy and the glue: what the chain records
    assert asked[0][1].tolist() == [*prompt, *opening] and asked[1][1].tolist() == [
        *prompt,
        *opening,
        *sampled,
        *glue_ids,
    ]
    assert [a[2] for a in asked] == [9, 9]
    mask = [0] * len(opening) + [1] * len(sampled) + [0] * len(glue_ids) + [1] * len(acted)
    assert out.mask.tolist() == mask
    sampled_at = [1.0] * len(opening) + [1.4] * len(sampled) + [1.0] * len(glue_ids) + [0.7] * len(acted)
    assert out.temperatures.tolist() == pytest.approx(sampled_at)
    assert out.response.logprobs[out.mask == 0].tolist() == [0.0] * (len(opening) + len(glue_ids))
    assert set(out.response.logprobs[: len(opening) + len(sampled)][len(opening) :].tolist()) == {-2.0}
    assert out.strategy == strategy_text.removesuffix(STRATEGY_CLOSE) and out.action_text == "open door to kitchen"
    assert out.strategy_tokens == len(sampled) and out.response.policy_version == 3  # the older of the two
    text = tokenizer.decode(out.response.token_ids.tolist())
    assert text.startswith(STRATEGY_OPEN) and f"{STRATEGY_CLOSE}\nopen door" in text


def test_a_strategy_whose_last_token_ends_the_line_gets_no_line_break_of_the_actors(tokenizer):
    strategist = Strategist(tokenizer)
    closed = "look for an animal" + STRATEGY_CLOSE + "\n"  # the tag's last token may carry the line break
    out = strategist.turn(
        ids(tokenizer, "hi"),
        0,
        lambda p, s: answer(tokenizer, closed, 1.0, -1.0),
        lambda p, s: answer(tokenizer, "look around\n", 1.0, -1.0),
    )
    assert out.mask.tolist() == [0] * len(ids(tokenizer, STRATEGY_OPEN)) + [1] * (
        len(ids(tokenizer, closed)) + len(ids(tokenizer, "look around\n"))
    )


def test_the_reflection_block_lists_the_strategies_with_their_scores():
    block = format_reflection_block(["find the animal", "go outside"], [25.0, 8.0])
    assert block.startswith("\n<reflection>") and block.endswith("</reflection>")
    assert "- (score 25) find the animal\n- (score 8) go outside" in block


# ------------------------------------------------------------------------------- the env worker


def sge_servers(stub_server, tokenizer):
    def policy(msg):
        if isinstance(msg, Ping):
            return Pong(role="policy_server", policy_version=3, ready=True)
        assert isinstance(msg, GenerateRequest)
        if STRATEGY_CLOSE in msg.stop:
            return answer(tokenizer, f"open the door at {msg.temperature}" + STRATEGY_CLOSE, msg.temperature, -1.0)
        return answer(tokenizer, "open door\n", msg.temperature, -0.5)

    def memory(msg):
        if isinstance(msg, Ping):
            return Pong(role="memory_service", policy_version=-1, ready=True)
        if isinstance(msg, StrategyQuery):
            return StrategyResult(strategies=["look around first"], scores=[12.0])
        assert isinstance(msg, EpisodeReport)
        return Ack(ref=msg.episode_id)

    return stub_server(policy), stub_server(memory)


def test_each_member_writes_its_strategies_at_its_own_temperature_after_the_groups_reflection(stub_server, tokenizer):
    policy, memory = sge_servers(stub_server, tokenizer)
    from tests.helpers import free_endpoint

    cfg = _cfg(
        (policy, memory, free_endpoint()), "preset=sge", "env_actor.temperature=0.7", "sge.max_strategy_tokens=20"
    )
    prompts = PlainPrompts()
    prompts.tokenizer = tokenizer
    worker = EnvWorker(**cfg, runner=EpisodeRunner(ScriptedEnv(2), prompts, max_steps=5, sge=cfg["sge"]))
    members = [
        Assignment(group_id="g1", slot=k, task="open-door", variation=1, mode=ON_POLICY, seed=k, strategy_temperature=t)
        for k, t in enumerate((0.6, 1.4))
    ]
    try:
        episodes = [worker.play(a) for a in members]
        for episode in episodes:
            worker.report_episode(episode)
    finally:
        worker.close()
    requests = [m for m in policy.received if isinstance(m, GenerateRequest)]
    # per member and turn (sge.replan_every 1): a strategy at the member's temperature, then the action at 0.7
    # (the action at least one token: after the strategy's line break a small model often starts with another)
    assert [(r.temperature, r.stop, r.max_tokens, r.min_tokens) for r in requests] == [
        request
        for member_t in (0.6, 1.4)
        for _turn in range(2)
        for request in ((member_t, [STRATEGY_CLOSE], 20, 0), (0.7, ["\n"], cfg["env_actor"].max_action_tokens, 1))
    ]
    for episode, t in zip(episodes, (0.6, 1.4)):
        trajectory = episode.trajectory
        assert trajectory.strategies == [f"open the door at {t}"] * 2 and trajectory.strategy_temperature == t
        assert trajectory.actions == ["open door", "open door"] and episode.stats.strategy_tokens[0] > 0
        assert 0 < int(trajectory.response_mask.sum()) < trajectory.response_token_ids.size  # glue is marked
        trajectory.validate()
    # one reflection for the group, the same block in both members' system part
    assert [m.group_id for m in memory.received if isinstance(m, StrategyQuery)] == ["g1", "g1"]
    blocks = {ctx.reflection_block for ctx in prompts.contexts}
    assert blocks == {format_reflection_block(["look around first"], [12.0])}
    assert all(ctx.format_instructions.endswith(STRATEGY_INSTRUCTIONS) for ctx in prompts.contexts)
    reports = [m for m in memory.received if isinstance(m, EpisodeReport)]
    assert [(r.strategy, r.strategy_temperature, r.reflect) for r in reports] == [
        ("open the door at 0.6", 0.6, False),  # preset=sge: p_memory 0, no tips written
        ("open the door at 1.4", 1.4, False),
    ]


def test_an_evaluation_episode_writes_strategies_at_its_temperature_without_a_reflection(stub_server, tokenizer):
    policy, memory = sge_servers(stub_server, tokenizer)
    from tests.helpers import free_endpoint

    cfg = _cfg((policy, memory, free_endpoint()), "preset=sge", "sge.replan_every=0")
    prompts = PlainPrompts()
    prompts.tokenizer = tokenizer
    worker = EnvWorker(**cfg, runner=EpisodeRunner(ScriptedEnv(3), prompts, max_steps=5, sge=cfg["sge"]))
    try:
        episode = worker.play(Assignment("eval-x", 0, "open-door", 1, ON_POLICY, 0), temperature=0.4)
    finally:
        worker.close()
    requests = [m for m in policy.received if isinstance(m, GenerateRequest)]
    # replan_every 0: a strategy at turn 0 only, at the evaluation's temperature
    assert [(r.temperature, r.stop, r.min_tokens) for r in requests] == [
        (0.4, [STRATEGY_CLOSE], 0), (0.4, ["\n"], 1), *[(0.4, ["\n"], 0)] * 2
    ]  # fmt: skip
    assert episode.trajectory.strategies == ["open the door at 0.4", "", ""]
    assert episode.trajectory.strategy_temperature == pytest.approx(0.4)  # as sampled, not the assignment's none
    assert memory.received == []
