"""The env actor's public client API, as an evaluation driver uses it: wait for the servers, play
an assignment at a chosen temperature (tips from the memory service in a tip mode), report the
episode; and a pool of envs playing a list of assignments. Against stub servers (conftest.py) and
a scripted stand-in for ScienceWorld (no JVM, no tokenizer)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from actors.env_actor.episode import TURN_SEEDS, EpisodeRunner
from actors.env_actor.process import EnvActor
from actors.env_actor.prompts import ChatTurn
from actors.env_actor.worker import EnvWorker
from common.scienceworld import StepResult
from pipeline.cli import given
from pipeline.config import load_config
from protocol.messages import (
    ON_POLICY,
    ON_POLICY_TIPS,
    Ack,
    Assignment,
    EpisodeReport,
    GenerateRequest,
    GenerateResponse,
    MemoryQuery,
    MemoryResult,
    Ping,
    Pong,
)
from tests.helpers import free_endpoint


def policy_answer(msg):
    if isinstance(msg, Ping):
        return Pong(role="policy_server", policy_version=3, ready=True)
    assert isinstance(msg, GenerateRequest)
    return GenerateResponse(
        request_id=msg.request_id,
        token_ids=np.array([7, 8], np.int32),
        logprobs=np.array([-0.5, -0.25], np.float32),
        text="open door",
        policy_version=3,
        finish_reason="stop",
    )


def memory_answer(msg):
    if isinstance(msg, Ping):
        return Pong(role="memory_service", policy_version=-1, ready=True)
    if isinstance(msg, MemoryQuery):
        return MemoryResult(tips=["the door is north"], scores=[80.0], count=1)
    assert isinstance(msg, EpisodeReport)
    return Ack(ref=msg.episode_id)


class ScriptedEnv:
    """Stands in for common.scienceworld.ScienceWorld: the episode ends after `turns` steps."""

    def __init__(self, turns: int):
        self.turns, self.steps, self.task_description, self.closed = turns, 0, "", False

    def reset(self, task: str, variation: int) -> StepResult:
        self.steps, self.task_description = 0, f"Your task is to {task} ({variation})."
        return StepResult("a hallway", "a hallway", 0.0, False, ["open door", "look around"])

    def step(self, action: str) -> StepResult:
        self.steps += 1
        done = self.steps >= self.turns
        return StepResult(f"you {action}", f"you {action}", 100.0 if done else 10.0, done, ["open door"])

    def close(self) -> None:
        self.closed = True

    def goal_progress(self) -> str:
        return f"{self.steps} steps taken"

    def train_variations(self, task: str) -> list[int]:
        return [0, 1, 2]

    def action_templates(self) -> list[str]:
        return ["open OBJ", "look around"]

    def demonstration(self, task: str, variation: int) -> tuple[str, list[str]]:
        self.demonstrated = (task, variation)
        return f"Your task is to {task} ({variation}).", ["open door", "go to hallway"]


class PlainPrompts:
    """Stands in for actors.env_actor.prompts.PromptBuilder: one token per tip, no tokenizer, every prompt a
    chain of its own; `pasts` records the past turns each prompt followed."""

    def __init__(self):
        self.contexts, self.pasts = [], []

    def chat(self, ctx):
        self.contexts.append(ctx)
        return PlainChat(self)


class PlainChat:
    def __init__(self, prompts):
        self.prompts, self.past = prompts, []

    def prompt(self, state, tips, note=""):
        self.prompts.pasts.append(list(self.past))
        ids = np.arange(4 + len(tips), dtype=np.int32)
        spans = [(4, 4 + len(tips))] if tips else []
        return type("Prompt", (), {"token_ids": ids, "tip_spans": spans, "chain_start": True, "tips": list(tips)})()

    def answered(self, state, tips, note, response_ids):
        self.past.append(ChatTurn(state, tips, response_ids, note))


@pytest.fixture
def servers(stub_server):
    """(policy server, memory service, a replay buffer endpoint nothing listens on: not asked here)"""
    return stub_server(policy_answer), stub_server(memory_answer), free_endpoint()


def _cfg(servers, *extra):
    policy, memory, buffer = servers
    return given(
        "empo2-env-actor",
        load_config(
            [
                f"endpoints.policy_servers=[{policy.endpoint}]",
                f"endpoints.memory_service={memory.endpoint}",
                f"endpoints.replay_buffer={buffer}",
                "startup_timeout_s=10",
                *extra,
            ]
        ),
    )


def _assignment(mode: str, seed: int = 2, task: str = "open-door") -> Assignment:
    return Assignment(group_id=f"eval-{uuid.uuid4().hex[:6]}", slot=0, task=task, variation=1, mode=mode, seed=seed)


def test_play_an_assignment_with_tips_at_a_given_temperature_then_report_it(servers):
    policy, memory, _ = servers
    env = ScriptedEnv(turns=2)
    worker = EnvWorker(**_cfg(servers), runner=EpisodeRunner(env, PlainPrompts(), max_steps=5))
    try:
        worker.wait_ready(buffer=False, memory=True)
        episode = worker.play(_assignment(ON_POLICY_TIPS), temperature=0.4)
        worker.report_episode(episode)
    finally:
        worker.close()
    trajectory = episode.trajectory
    assert (trajectory.task, trajectory.variation, trajectory.mode) == ("open-door", 1, ON_POLICY_TIPS)
    assert trajectory.num_turns == 2 and trajectory.done and trajectory.score == 100.0
    assert trajectory.actions == ["open door", "open door"]
    assert trajectory.policy_versions.tolist() == [3, 3]
    assert trajectory.memory_retrieved.tolist() == [1, 1] and trajectory.num_memories.tolist() == [1, 1]
    assert trajectory.generated_texts == ["open door", "open door"]
    assert trajectory.success  # done with 100 > 70
    assert episode.task_description == "Your task is to open-door (1)."
    assert episode.stats.tips_shown == 2 and episode.stats.memory_fallbacks == 0
    generations = [m for m in policy.received if isinstance(m, GenerateRequest)]
    assert [g.temperature for g in generations] == [0.4, 0.4]
    assert [g.seed for g in generations] == [2 * TURN_SEEDS, 2 * TURN_SEEDS + 1]
    [report] = [m for m in memory.received if isinstance(m, EpisodeReport)]
    assert (report.episode_id, report.task_description) == (trajectory.episode_id, episode.task_description)
    assert report.actions == trajectory.actions
    assert env.closed


def test_play_without_tips_uses_the_configured_temperature_and_asks_no_memory(servers):
    policy, memory, _ = servers
    worker = EnvWorker(
        **_cfg(servers, "env_actor.temperature=0.7"), runner=EpisodeRunner(ScriptedEnv(1), PlainPrompts(), max_steps=5)
    )
    try:
        episode = worker.play(_assignment(ON_POLICY))
    finally:
        worker.close()
    assert episode.stats.tips_shown == 0 and episode.trajectory.num_turns == 1
    assert episode.trajectory.memory_retrieved.tolist() == [0]  # no tips in this mode: nothing retrieved
    assert [m.temperature for m in policy.received if isinstance(m, GenerateRequest)] == [0.7]
    assert memory.received == []


def test_a_pool_plays_every_assignment_and_returns_them_in_order(servers):
    pool = EnvActor(**_cfg(servers, "env_actor.envs_per_actor=2"))
    envs = [ScriptedEnv(turns=1 + slot) for slot in range(len(pool.workers))]
    for worker, env in zip(pool.workers, envs):
        worker.runner = EpisodeRunner(env, PlainPrompts(), max_steps=5)
    assignments = [_assignment(ON_POLICY, seed=k, task=f"task-{k}") for k in range(5)]
    try:
        pool.wait_ready(buffer=False)
        episodes = pool.play_all(assignments, temperature=0.0)
    finally:
        pool.close()
    assert [e.trajectory.task for e in episodes] == [f"task-{k}" for k in range(5)]
    assert {e.trajectory.actor_id for e in episodes} <= {"actor0", "actor0.1"}
    assert all(e.trajectory.done for e in episodes)
    assert all(env.closed for env in envs)


def _response(text: str) -> GenerateResponse:
    return GenerateResponse(
        request_id="r",
        token_ids=np.array([7], np.int32),
        logprobs=np.array([-0.5], np.float32),
        text=text,
        policy_version=0,
        finish_reason="stop",
    )


def test_a_failed_retrieval_is_marked_not_retrieved_and_counts_no_memories():
    """Turn 0: the memory service is down (None); turn 1: it answers with no memories; turn 2: one.
    Only turn 0 is marked not retrieved; n is 0 on both of the first two turns."""
    answers = iter([None, ([], 0), (["tip"], 1)])
    runner = EpisodeRunner(ScriptedEnv(turns=3), PlainPrompts(), max_steps=5)
    trajectory, stats = runner.play(
        _assignment(ON_POLICY_TIPS), "actor0", lambda ids, seed: _response("Open the door.\n"), lambda *q: next(answers)
    )
    assert trajectory.memory_retrieved.tolist() == [0, 1, 1]
    assert trajectory.num_memories.tolist() == [0, 0, 1]
    assert stats.memory_fallbacks == 1
    # the raw generation is kept next to the valid action it was mapped to
    assert trajectory.generated_texts == ["Open the door.\n"] * 3
    assert trajectory.actions == ["open door"] * 3
    trajectory.validate()


def test_success_needs_done_and_a_score_above_70():
    class Stuck(ScriptedEnv):  # never done, scores 100
        def step(self, action):
            return StepResult("o", "o", 100.0, False, ["open door"])

    play = lambda env: EpisodeRunner(env, PlainPrompts(), max_steps=2).play(  # noqa: E731
        _assignment(ON_POLICY), "a", lambda ids, seed: _response("open door"), lambda *q: None
    )[0]
    assert play(ScriptedEnv(turns=1)).success  # done, 100
    stuck = play(Stuck(turns=1))
    assert stuck.score == 100.0 and not stuck.done and not stuck.success


def test_episode_metrics_count_successes_by_mode(servers):
    worker = EnvWorker(**_cfg(servers), runner=EpisodeRunner(ScriptedEnv(1), PlainPrompts(), max_steps=5))
    try:
        worker._record(worker.play(_assignment(ON_POLICY)))  # done with 100: a success
    finally:
        worker.close()
    sample = worker.metrics.registry.get_sample_value
    assert sample("empo2_env_actor_episodes_total", {"mode": ON_POLICY}) == 1
    assert sample("empo2_env_actor_episodes_success_total", {"mode": ON_POLICY}) == 1


@pytest.mark.parametrize("stop_at_newline, stop", [(True, ["\n"]), (False, [])])
def test_the_newline_stop_is_a_config_key(servers, stop_at_newline, stop):
    policy, _, _ = servers
    worker = EnvWorker(**_cfg(servers, f"env_actor.stop_at_newline={str(stop_at_newline).lower()}"))
    try:
        worker.generate(np.arange(3, dtype=np.int32), seed=1)
    finally:
        worker.close()
    [request] = [m for m in policy.received if isinstance(m, GenerateRequest)]
    assert request.stop == stop


@pytest.mark.parametrize("variation, demo_variation", [(0, 1), (1, 0), (2, 0), (225, 0)])
def test_the_demonstration_is_another_training_variation(variation, demo_variation):
    """Played variation 0: the demonstration is variation 1's gold path; any other: variation 0's;
    a test variation (225, not in the training list) also gets a training variation's."""
    env, prompts = ScriptedEnv(turns=2), PlainPrompts()
    runner = EpisodeRunner(env, prompts, max_steps=5, demo_steps=0)
    a = Assignment(group_id="g", slot=0, task="open-door", variation=variation, mode=ON_POLICY, seed=1)
    runner.play(a, "a", lambda ids, seed: _response("open door"), lambda *q: None)
    assert env.demonstrated == ("open-door", demo_variation)
    ctx = prompts.contexts[0]
    assert ctx.task == f"Your task is to open-door ({variation})."  # the played variation's description
    assert ctx.demonstration.variation == demo_variation != variation
    assert ctx.demonstration.actions == ["open door", "go to hallway"]
    assert ctx.action_templates == ["open OBJ", "look around"]
    # the past turns of the chat: (state shown, its tips, the note on the action before, the response's tokens)
    [turn] = prompts.pasts[1]
    assert (turn.state, turn.tips, turn.note) == ("a hallway", [], "")
    np.testing.assert_array_equal(turn.response_ids, _response("open door").token_ids)


def test_the_demonstration_can_be_cut_or_left_out():
    prompts = PlainPrompts()
    a = _assignment(ON_POLICY)
    EpisodeRunner(ScriptedEnv(1), prompts, max_steps=5, demo_steps=1).play(
        a, "a", lambda ids, seed: _response("open door"), lambda *q: None
    )
    EpisodeRunner(ScriptedEnv(1), prompts, max_steps=5).play(
        a, "a", lambda ids, seed: _response("open door"), lambda *q: None
    )
    assert prompts.contexts[0].demonstration.actions == ["open door"]
    assert prompts.contexts[1].demonstration is None


def test_a_stopping_actor_returns_its_unfinished_slot(stub_server, servers):
    """EnvActor.close (a graceful stop) gives the slot its worker was playing back to the buffer."""
    from protocol.messages import Ack, AssignmentReturn

    buffer = stub_server(lambda msg: Ack(ref="returned"))
    policy, memory, _ = servers
    actor = EnvActor(**_cfg((policy, memory, buffer.endpoint)))
    playing = _assignment(ON_POLICY)
    actor.workers[0].playing = playing
    actor.close()
    assert buffer.received == [
        AssignmentReturn(group_id=playing.group_id, slot=0, actor_id="actor0", incarnation=actor.incarnation)
    ]
    assert actor.workers[0].playing is None
    actor.close()  # nothing left to return: no second message
    assert len(buffer.received) == 1


def test_a_refused_upload_loses_that_episode_only_and_is_counted(stub_server, servers):
    """The buffer refuses a trajectory (e.g. its slot was handed out again and filled): the worker
    logs and counts it and goes on to its next episode instead of stopping (issue 14)."""
    from protocol.messages import ErrorReply

    buffer = stub_server(lambda msg: ErrorReply(reason="slot_filled", detail="slot 0 already holds another episode"))
    policy, memory, _ = servers
    worker = EnvWorker(
        **_cfg((policy, memory, buffer.endpoint)), runner=EpisodeRunner(ScriptedEnv(1), PlainPrompts(), max_steps=5)
    )
    try:
        episode = worker.play(_assignment(ON_POLICY))
        worker._upload(episode.trajectory)  # no exception
        assert (
            worker.metrics.registry.get_sample_value("empo2_env_actor_errors_total", {"where": "upload_refused"}) == 1
        )
    finally:
        worker.close()


@pytest.mark.parametrize("p_memory, reported", [(0.25, True), (0.0, False)])
def test_the_training_loop_reports_episodes_to_memory_only_when_tip_rollouts_can_read_it(
    stub_server, servers, p_memory, reported
):
    """With p = 0 (GRPO) no rollout ever reads the memory, so the episodes go to no reflection (which
    would take the policy server's time): one assignment played, uploaded, reported or not."""
    from protocol import RemoteError
    from protocol.messages import ErrorReply, LeaseRenewal, Trajectory

    given = []

    def buffer_answer(msg):
        if isinstance(msg, Ping):
            return Pong(role="replay_buffer", policy_version=0, ready=True)
        if isinstance(msg, LeaseRenewal):  # the worker's keep-alive thread
            return Ack(ref=f"{msg.group_id}/{msg.slot}")
        if isinstance(msg, Trajectory):
            return Ack(ref=msg.episode_id)
        if given:  # the second assignment request ends the loop
            return ErrorReply(reason="stop", detail="end of the test")
        given.append(_assignment(ON_POLICY))
        return given[-1]

    policy, memory, _ = servers
    buffer = stub_server(buffer_answer)
    worker = EnvWorker(
        **_cfg((policy, memory, buffer.endpoint), f"replay_buffer.p_memory={p_memory}"),
        runner=EpisodeRunner(ScriptedEnv(1), PlainPrompts(), max_steps=5),
    )
    with pytest.raises(RemoteError):
        worker.run()
    assert [m.episode_id for m in buffer.received if isinstance(m, Trajectory)] != []  # played and uploaded
    assert any(isinstance(m, EpisodeReport) for m in memory.received) == reported


def test_a_server_waiting_for_the_newest_weights_is_passed_over_then_used_again(stub_server, servers, monkeypatch):
    """A policy server answers not_ready (restarted, waiting for the run's newest weights): the turn
    goes to the other server at once; with no other server up, it waits and asks again."""
    import actors.env_actor.worker as worker_module
    from protocol.messages import ErrorReply

    monkeypatch.setattr(worker_module, "NOT_READY_RETRY_S", 0.01)
    waiting = {"left": 3}  # this server's next 3 generations are refused

    def restarted_answer(msg):
        if isinstance(msg, GenerateRequest) and waiting["left"] > 0:
            waiting["left"] -= 1
            return ErrorReply(reason="not_ready", detail="waiting for the run's policy version 4 (loaded: 0)")
        return policy_answer(msg)

    restarted, other = stub_server(restarted_answer), servers[0]
    prompt = np.array([1, 2], np.int32)
    two = (_cfg(servers, f"endpoints.policy_servers=[{restarted.endpoint},{other.endpoint}]"), 2)
    one = (_cfg(servers, f"endpoints.policy_servers=[{restarted.endpoint}]"), 1)
    for cfg, servers_up in (two, one):
        worker = EnvWorker(**cfg, runner=EpisodeRunner(ScriptedEnv(1), PlainPrompts(), max_steps=5))
        try:
            assert worker.generate(prompt, seed=0).text == "open door"
        finally:
            worker.close()
        errors = worker.metrics.registry.get_sample_value("empo2_env_actor_errors_total", {"where": "not_ready"})
        if servers_up == 2:  # refused once, answered by the other server
            assert errors == 1 and waiting["left"] == 2
            assert sum(isinstance(m, GenerateRequest) for m in other.received) == 1
        else:  # alone: asked again until its wait is over
            assert errors == 2 and waiting["left"] == 0
