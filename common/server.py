"""What every server shares: a handler table per server (message type -> method) with one answer
to a type it does not serve, and the request loop of the synchronous servers (replay buffer,
memory service): receive, reject and count malformed input, answer, count. The policy server has
its own asyncio loop over the same kind of table."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import zmq

from common.heartbeat import beat
from common.metrics import RoleMetrics
from protocol import Message, ProtocolError, bind_router, recv_request, send_reply
from protocol.codec import MAX_DETAIL_CHARS
from protocol.messages import DoorLimits, ErrorReply
from protocol.security import check_sender, watch_handshakes

log = logging.getLogger(__name__)

# Refused input is logged as one bounded line per message, at most this many lines a minute; the rest
# are summed up in the next line that is written (a fuzz run of 10,000 inputs wrote 131 MB before).
REJECTION_LOG_LINES_PER_MINUTE = 20
# An idle request loop still turns this often, and each turn is a heartbeat (common/heartbeat.py).
IDLE_POLL_MS = 1000


class RejectionLog:
    """Rate-limited, bounded log lines for refused messages: the reason and a cut explanation, never
    the input. The counts per reason are in the metrics (empo2_<role>_messages_rejected_total)."""

    def __init__(self, lines_per_minute: int = REJECTION_LOG_LINES_PER_MINUTE):
        self.lines_per_minute = lines_per_minute
        self.window_start, self.lines, self.suppressed = time.monotonic(), 0, 0
        self.lock = threading.Lock()  # the policy server logs from its loop, the memory service from two threads

    def note(self, exc: ProtocolError) -> None:
        with self.lock:
            now = time.monotonic()
            if now - self.window_start >= 60.0:
                self.window_start, self.lines = now, 0
            if self.lines >= self.lines_per_minute:
                self.suppressed += 1
                return
            self.lines += 1
            suppressed, self.suppressed = self.suppressed, 0
        more = f" ({suppressed} more refused since the last line)" if suppressed else ""
        log.warning("refused message: %s%s", str(exc)[:MAX_DETAIL_CHARS], more)


rejections = RejectionLog()  # one per process: every server loop of the process writes through it


def refuse(exc: ProtocolError, metrics: RoleMetrics) -> ErrorReply:
    """Count and (rate-limited) log a refused message; the ErrorReply that answers it."""
    metrics.rejected.labels(exc.reason).inc()
    rejections.note(exc)
    return ErrorReply(reason=exc.reason, detail=str(exc)[:MAX_DETAIL_CHARS])


# A server's handler table: the message types it serves, each with the method that answers it.
HandlerTable = Mapping[type[Message], Callable[..., Any]]


def unexpected_kind(msg: Message, metrics: RoleMetrics) -> ErrorReply:
    """The answer of every server to a well-formed message of a type it does not serve, counted
    in empo2_<role>_messages_rejected_total{reason="unexpected_kind"}."""
    metrics.rejected.labels("unexpected_kind").inc()
    return ErrorReply(reason="unexpected_kind", detail=f"{msg.KIND} is not served here")


def dispatch(
    handlers: HandlerTable,
    msg: Message,
    metrics: RoleMetrics,
    *context: Any,
    limits: DoorLimits | None = None,
    sender: str | None = None,
) -> Any:
    """`handlers[type(msg)](msg, *context)`: what the handler returns (a reply, or for the asyncio
    policy server possibly a coroutine), or the unexpected_kind ErrorReply when the table has no
    entry for the message's type.

    The door: under CURVE the `sender`'s role must be one that may send the message
    (protocol/security.py, SENDERS), then the message is checked against the server's `limits`
    (Message.check); a ProtocolError raised by the checks or by a synchronous handler (a
    server-side refusal: no lease, not the learner, ...) is answered with ErrorReply(reason) and
    counted, never stored."""
    handler = handlers.get(type(msg))
    if handler is None:
        return unexpected_kind(msg, metrics)
    try:
        admit(msg, limits, sender)
        return handler(msg, *context)
    except ProtocolError as exc:
        return refuse(exc, metrics)


def admit(msg: Message, limits: DoorLimits | None, sender: str | None) -> None:
    """The door's checks of a well-formed message: its sender's role (under CURVE), then the
    server's limits; ProtocolError if refused."""
    check_sender(msg, sender)
    if limits is not None:
        msg.check(limits)


@dataclass
class AfterCommit:
    """A handler's reply that may go out only once the server's next commit has run (group
    commit: the replay buffer fsyncs its log once for every Ack held since the last fsync)."""

    reply: Message


# A server's batched handlers: a message type whose requests waiting together are answered in one call
# (message list -> reply list, in order), e.g. the memory service's queries, one embedding call for all.
BatchTable = Mapping[type[Message], Callable[[list[Message]], list[Message]]]


def serve_requests(
    endpoint: str,
    handlers: HandlerTable,
    metrics: RoleMetrics,
    limits: DoorLimits | None = None,
    commit: Callable[[], None] | None = None,
    commit_interval_s: float = 0.0,
    batched: BatchTable | None = None,
    max_batch: int = 1,
) -> None:
    """Bind a ROUTER at `endpoint` and answer every request with its handler's reply, forever;
    every message is checked against `limits` first (dispatch). A reply wrapped in AfterCommit is
    held; at most `commit_interval_s` after the first one held, `commit()` runs and every held
    reply goes out (requests keep being served meanwhile). A request of a `batched` type takes the
    requests already waiting with it, up to `max_batch` of that type (the others are answered as they
    come), and they are answered by one call of its batch handler (each one through the door first).
    Every turn of the loop, an idle one at least every IDLE_POLL_MS, is a heartbeat: a stuck handler
    or commit stops it."""
    batched = batched or {}
    sock = bind_router(zmq.Context.instance(), endpoint)
    watch_handshakes(sock, metrics.handshake_failures)
    held: list[tuple[bytes, Message]] = []  # (client, reply) waiting for the next commit
    due = 0.0

    def answer(request) -> None:
        nonlocal due
        reply = dispatch(handlers, request.message, metrics, limits=limits, sender=request.sender)
        if isinstance(reply, AfterCommit):
            if not held:
                due = time.monotonic() + commit_interval_s
            held.append((request.identity, reply.reply))
            return
        send_reply(sock, request.identity, reply)
        metrics.messages_out.labels(reply.KIND).inc()

    while True:
        beat()
        if held:
            wait_ms = max(0, int((due - time.monotonic()) * 1000))
            if wait_ms == 0 or not sock.poll(wait_ms, zmq.POLLIN):
                commit()
                for identity, reply in held:
                    send_reply(sock, identity, reply)
                    metrics.messages_out.labels(reply.KIND).inc()
                held.clear()
                continue
        elif not sock.poll(IDLE_POLL_MS, zmq.POLLIN):
            continue
        request = receive(sock, metrics)
        if request is None:
            continue
        if type(request.message) in batched and max_batch > 1:
            serve_batch(sock, request, batched[type(request.message)], answer, metrics, limits, max_batch)
        else:
            answer(request)


def receive(sock, metrics: RoleMetrics):
    """The next request, counted; None for a malformed one (answered with ErrorReply in recv_request)."""
    try:
        request = recv_request(sock)
    except ProtocolError as exc:
        metrics.rejected.labels(exc.reason).inc()
        rejections.note(exc)
        return None
    metrics.messages_in.labels(request.message.KIND).inc()
    return request


def serve_batch(
    sock,
    first,
    handle: Callable[[list[Message]], list[Message]],
    answer: Callable[[Any], None],
    metrics: RoleMetrics,
    limits: DoorLimits | None,
    max_batch: int,
) -> None:
    """`first` and the requests of its type already waiting on `sock` (up to `max_batch`), through the
    door one by one, then answered by one call of `handle`; a request of another type met on the way is
    answered as the loop answers it (`answer`: each client waits for its own reply only)."""
    kind, taken = type(first.message), [first]
    while len(taken) < max_batch and sock.poll(0, zmq.POLLIN):
        request = receive(sock, metrics)
        if request is not None and type(request.message) is kind:
            taken.append(request)
        elif request is not None:
            answer(request)
    admitted = []
    for request in taken:
        try:
            admit(request.message, limits, request.sender)
            admitted.append(request)
        except ProtocolError as exc:
            send_reply(sock, request.identity, refuse(exc, metrics))
    for request, reply in zip(admitted, handle([r.message for r in admitted]) if admitted else []):
        send_reply(sock, request.identity, reply)
        metrics.messages_out.labels(reply.KIND).inc()
