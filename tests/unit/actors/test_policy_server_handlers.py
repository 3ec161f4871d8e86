"""The policy server's handler table, without an engine: a ping is answered not ready, a type
the server does not serve gets the unexpected_kind answer every server gives (and is counted)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from actors.policy_server.server import PolicyServer
from common.server import dispatch
from pipeline.cli import given
from pipeline.config import load_config
from protocol.messages import ErrorReply, MemoryQuery, Ping, Pong


def test_ping_and_an_unserved_type_through_the_table(tmp_path):
    server = PolicyServer(**given("empo2-policy-server", load_config([f"run_dir={tmp_path}"])))
    identity = b"client"
    pong = dispatch(server.handlers, Ping(sender="t"), server.metrics, identity)
    assert pong.uptime_s >= 0  # how long its process has been up (protocol/transport.py: a lost request)
    assert replace(pong, uptime_s=-1.0) == Pong(role="policy_server", policy_version=-1, ready=False)  # no engine yet
    reply = dispatch(server.handlers, MemoryQuery(task="t", variation=0, state="s"), server.metrics, identity)
    assert reply == ErrorReply(reason="unexpected_kind", detail="memory_query is not served here")
    rejected = server.metrics.registry.get_sample_value(
        "empo2_policy_server_messages_rejected_total", {"reason": "unexpected_kind"}
    )
    assert rejected == 1


class _DeadEngine:
    """A stand-in for PolicyEngine whose vLLM engine core has died."""

    version = 0

    async def generate(self, *args):
        from vllm.v1.engine.exceptions import EngineDeadError

        raise EngineDeadError()


class _FailingEngine(_DeadEngine):
    async def generate(self, *args):
        raise ValueError("one bad request")


def test_a_dead_engine_stops_the_server_and_a_failed_request_does_not(tmp_path):
    """A request that fails is answered generate_failed and the server goes on; once vLLM's engine
    core is dead (EngineDeadError) the server also stops its receive loop, so that main exits with
    status 1 and the supervisor starts a fresh server instead of one that fails every request."""
    import asyncio

    from protocol.messages import GenerateRequest

    async def scenario(engine) -> tuple[PolicyServer, list, bool]:
        server = PolicyServer(**given("empo2-policy-server", load_config([f"run_dir={tmp_path}"])))
        server.engine, sent = engine, []

        async def send(identity, msg):
            sent.append(msg)

        server._send = send
        server._recv_task = asyncio.create_task(asyncio.sleep(60))
        req = GenerateRequest(
            request_id="r", prompt_token_ids=np.array([1, 2], dtype=np.int32), max_tokens=4, temperature=1.0, seed=0
        )
        await server._generate(req, b"client")
        await asyncio.sleep(0)
        return server, sent, server._recv_task.cancelled()  # (asyncio.run cancels what is left at its end)

    server, sent, stopped = asyncio.run(scenario(_FailingEngine()))
    assert [m.reason for m in sent] == ["generate_failed"] and not server.engine_dead and not stopped
    server, sent, stopped = asyncio.run(scenario(_DeadEngine()))
    assert [m.reason for m in sent] == ["generate_failed"] and server.engine_dead and stopped


class _SlowEngine(_DeadEngine):
    """A stand-in engine whose generation runs until `done` is set (a hung engine core, until then)."""

    def __init__(self):
        import asyncio

        self.done = asyncio.Event()

    async def generate(self, req):
        from actors.policy_server.engine import Completion

        await self.done.wait()
        return Completion(np.array([1], dtype=np.int32), np.array([-0.1], dtype=np.float32), "a", "stop", 0, 2)


def test_the_heartbeat_is_idle_time_or_completions_never_work_in_flight(tmp_path, monkeypatch):
    """The policy server beats (common/heartbeat.py) while idle, and with a generation in the engine
    only when one completes: a generation that never returns stops its heartbeat."""
    import asyncio

    import actors.policy_server.server as server_module
    from protocol.messages import GenerateRequest

    monkeypatch.setattr(server_module, "HEARTBEAT_TICK_S", 0.01)

    async def scenario() -> None:
        server = PolicyServer(**given("empo2-policy-server", load_config([f"run_dir={tmp_path}"])))
        server.engine, beats = _SlowEngine(), []
        monkeypatch.setattr(server_module, "beat", lambda lane="main": beats.append(server.busy))

        async def send(identity, msg):
            pass

        server._send = send
        ticker = asyncio.create_task(server._heartbeat())
        await asyncio.sleep(0.05)
        assert beats and set(beats) == {0}  # idle: beats
        req = GenerateRequest(
            request_id="r", prompt_token_ids=np.array([1, 2], dtype=np.int32), max_tokens=4, temperature=1.0, seed=0
        )
        generation = asyncio.create_task(server._generate(req, b"client"))
        await asyncio.sleep(0.02)
        during = len(beats)
        await asyncio.sleep(0.1)
        assert len(beats) == during and server.busy == 1  # in flight, not complete: no beat
        server.engine.done.set()
        await generation
        assert len(beats) > during and server.busy == 0  # its completion is progress
        ticker.cancel()

    asyncio.run(scenario())


class _ReadyEngine(_DeadEngine):
    async def generate(self, req):
        from actors.policy_server.engine import Completion

        return Completion(
            np.array([1], dtype=np.int32), np.array([-0.1], dtype=np.float32), "a", "stop", self.version, 2
        )


def test_a_server_started_into_a_run_serves_nothing_until_the_newest_weights_arrive(tmp_path):
    """The learner published version 4 (protocol/newest_version.py) and this server's engine loaded
    the base model (version 0): generations are answered not_ready, the Pong says what it awaits,
    and the first weight update lifts the wait; the next generation is at that update's version."""
    import asyncio

    from protocol.messages import GenerateRequest
    from protocol.newest_version import publish_newest_version

    publish_newest_version(tmp_path, 4)

    async def scenario() -> list:
        server = PolicyServer(**given("empo2-policy-server", load_config([f"run_dir={tmp_path}"])))
        server.engine, sent = _ReadyEngine(), []
        server.awaiting_version = server.version_to_await()  # as run() does once the engine is up
        assert server.awaiting_version == 4

        async def send(identity, msg):
            sent.append(msg)

        server._send = send
        req = GenerateRequest(
            request_id="r", prompt_token_ids=np.array([1, 2], dtype=np.int32), max_tokens=4, temperature=1.0, seed=0
        )
        await server._generate(req, b"actor")
        sent.append(server._ping(Ping(sender="learner"), b"learner"))
        server.engine.version = 4  # the learner's catch-up push
        await server._updated(b"learner", 4, 0, 0.1, 0.0)
        await server._generate(req, b"actor")
        sent.append(server._ping(Ping(sender="learner"), b"learner"))
        return sent

    refused, waiting, ack, answer, served = asyncio.run(scenario())
    assert refused.reason == "not_ready" and "policy version 4" in refused.detail
    assert replace(waiting, uptime_s=-1.0) == Pong(
        role="policy_server", policy_version=0, ready=True, awaiting_version=4
    )
    assert ack.applied and answer.policy_version == 4
    assert replace(served, uptime_s=-1.0) == Pong(
        role="policy_server", policy_version=4, ready=True, awaiting_version=0
    )


def test_a_server_of_fixed_weights_does_not_wait_for_the_runs_newest_version(tmp_path):
    """empo2-eval and test-time adaptation start servers in a training run's directory to serve a
    checkpoint or the base model: they never wait for a version no learner will push
    (evaluation/config.py, FIXED_WEIGHTS)."""
    from evaluation.config import FIXED_WEIGHTS
    from protocol.newest_version import publish_newest_version

    publish_newest_version(tmp_path, 8)
    for overrides, awaited in (([], 8), (FIXED_WEIGHTS, 0)):
        server = PolicyServer(**given("empo2-policy-server", load_config([f"run_dir={tmp_path}", *overrides])))
        server.engine = _ReadyEngine()
        assert server.version_to_await() == awaited
