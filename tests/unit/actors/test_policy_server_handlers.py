"""The policy server's handler table, without an engine: a ping is answered not ready, a type
the server does not serve gets the unexpected_kind answer every server gives (and is counted)."""

from __future__ import annotations

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
    assert pong == Pong(role="policy_server", policy_version=-1, ready=False)  # no engine yet
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
