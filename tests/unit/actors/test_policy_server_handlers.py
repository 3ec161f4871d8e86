"""The policy server's handler table, without an engine: a ping is answered not ready, a type
the server does not serve gets the unexpected_kind answer every server gives (and is counted)."""

from __future__ import annotations

from actors.policy_server import PolicyServer
from common.server import dispatch
from pipeline.config import load_config
from protocol.messages import ErrorReply, MemoryQuery, Ping, Pong


def test_ping_and_an_unserved_type_through_the_table(tmp_path):
    server = PolicyServer(load_config([f"run_dir={tmp_path}"]), 0)
    identity = b"client"
    pong = dispatch(server.handlers, Ping(sender="t"), server.metrics, identity)
    assert pong == Pong(role="policy_server", policy_version=-1, ready=False)  # no engine yet
    reply = dispatch(server.handlers, MemoryQuery(task="t", variation=0, state="s"), server.metrics, identity)
    assert reply == ErrorReply(reason="unexpected_kind", detail="memory_query is not served here")
    rejected = server.metrics.registry.get_sample_value(
        "empo2_policy_server_messages_rejected_total", {"reason": "unexpected_kind"}
    )
    assert rejected == 1
