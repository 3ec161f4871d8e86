"""The request loop of the synchronous servers (replay buffer, memory service): receive, reject
and count malformed input, answer, count. The policy server has its own asyncio loop."""

from __future__ import annotations

import logging
from collections.abc import Callable

import zmq

from common.metrics import RoleMetrics
from protocol import Message, ProtocolError, bind_router, recv_request, send_reply

log = logging.getLogger(__name__)


def serve_requests(endpoint: str, handle: Callable[[Message], Message], metrics: RoleMetrics) -> None:
    """Bind a ROUTER at `endpoint` and answer every request with handle(request), forever."""
    sock = bind_router(zmq.Context.instance(), endpoint)
    while True:
        try:
            request = recv_request(sock)  # a malformed request is answered with ErrorReply there
        except ProtocolError as exc:
            metrics.rejected.labels(exc.reason).inc()
            log.warning("rejected message: %s", exc)
            continue
        metrics.messages_in.labels(request.message.KIND).inc()
        reply = handle(request.message)
        send_reply(sock, request.identity, reply)
        metrics.messages_out.labels(reply.KIND).inc()
