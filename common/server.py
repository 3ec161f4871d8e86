"""What every server shares: a handler table per server (message type -> method) with one answer
to a type it does not serve, and the request loop of the synchronous servers (replay buffer,
memory service): receive, reject and count malformed input, answer, count. The policy server has
its own asyncio loop over the same kind of table."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import zmq

from common.metrics import RoleMetrics
from protocol import Message, ProtocolError, bind_router, recv_request, send_reply
from protocol.messages import ErrorReply

log = logging.getLogger(__name__)

# A server's handler table: the message types it serves, each with the method that answers it.
HandlerTable = Mapping[type[Message], Callable[..., Any]]


def unexpected_kind(msg: Message, metrics: RoleMetrics) -> ErrorReply:
    """The answer of every server to a well-formed message of a type it does not serve, counted
    in empo2_<role>_messages_rejected_total{reason="unexpected_kind"}."""
    metrics.rejected.labels("unexpected_kind").inc()
    return ErrorReply(reason="unexpected_kind", detail=f"{msg.KIND} is not served here")


def dispatch(handlers: HandlerTable, msg: Message, metrics: RoleMetrics, *context: Any) -> Any:
    """`handlers[type(msg)](msg, *context)`: what the handler returns (a reply, or for the asyncio
    policy server possibly a coroutine), or the unexpected_kind ErrorReply when the table has no
    entry for the message's type."""
    handler = handlers.get(type(msg))
    if handler is None:
        return unexpected_kind(msg, metrics)
    return handler(msg, *context)


@dataclass
class AfterCommit:
    """A handler's reply that may go out only once the server's next commit has run (group
    commit: the replay buffer fsyncs its log once for every Ack held since the last fsync)."""

    reply: Message


def serve_requests(
    endpoint: str,
    handlers: HandlerTable,
    metrics: RoleMetrics,
    commit: Callable[[], None] | None = None,
    commit_interval_s: float = 0.0,
) -> None:
    """Bind a ROUTER at `endpoint` and answer every request with its handler's reply, forever.
    A reply wrapped in AfterCommit is held; at most `commit_interval_s` after the first one held,
    `commit()` runs and every held reply goes out (requests keep being served meanwhile)."""
    sock = bind_router(zmq.Context.instance(), endpoint)
    held: list[tuple[bytes, Message]] = []  # (client, reply) waiting for the next commit
    due = 0.0
    while True:
        if held:
            wait_ms = max(0, int((due - time.monotonic()) * 1000))
            if wait_ms == 0 or not sock.poll(wait_ms, zmq.POLLIN):
                commit()
                for identity, reply in held:
                    send_reply(sock, identity, reply)
                    metrics.messages_out.labels(reply.KIND).inc()
                held.clear()
                continue
        try:
            request = recv_request(sock)  # a malformed request is answered with ErrorReply there
        except ProtocolError as exc:
            metrics.rejected.labels(exc.reason).inc()
            log.warning("rejected message: %s", exc)
            continue
        metrics.messages_in.labels(request.message.KIND).inc()
        reply = dispatch(handlers, request.message, metrics)
        if isinstance(reply, AfterCommit):
            if not held:
                due = time.monotonic() + commit_interval_s
            held.append((request.identity, reply.reply))
            continue
        send_reply(sock, request.identity, reply)
        metrics.messages_out.labels(reply.KIND).inc()
