"""Socket conventions: every service is a ROUTER that binds; every client is a DEALER that connects.

One request, one reply. Servers never block on a client (ROUTER drops replies to vanished peers);
clients bound every wait with a timeout and, after a timeout, throw their socket away (the "lazy
pirate" pattern) so a late reply can never be taken for the answer to a later request.

A request in flight when its server dies is lost: the restarted server never saw it. So a client
that has waited LIVENESS_PROBE_S asks the server, on a socket of its own, how long it has been up
(`Pong.uptime_s`); a server up for less time than the request has waited started after it was sent,
and the wait ends at once with RequestLost (a RequestTimeout: callers retry as after a timeout)
instead of at the timeout, which is long for a generation or a weight push. A server that does not
answer the probe (busy, stopped, still down) is waited for as before.

High-water marks and the per-socket message size limit are explicit. ZMQ_MAXMSGSIZE makes libzmq
drop a peer that sends a frame over the limit before it is buffered; `decode` checks the total.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from protocol.codec import DEFAULT_MAX_MESSAGE_BYTES, Message, ProtocolError, decode, encode
from protocol.messages import ErrorReply, Ping, Pong
from protocol.security import secure_client, secure_server, sender_role

log = logging.getLogger(__name__)

DEFAULT_HWM = 1000
LIVENESS_PROBE_S = 10.0  # a client waiting this long for a reply asks whether the server restarted since
PROBE_REPLY_S = 2.0  # how long the probe waits for its Pong
_PROCESS_STARTED = time.monotonic()  # at import, before any server binds: an upper bound on its uptime


def process_uptime_s() -> float:
    """For a server's Pong: seconds since this process started (no later than its sockets' binding)."""
    return time.monotonic() - _PROCESS_STARTED


class RemoteError(RuntimeError):
    """The server answered with ErrorReply."""

    def __init__(self, reply: ErrorReply):
        super().__init__(f"{reply.reason}: {reply.detail}")
        self.reason = reply.reason


class RequestTimeout(TimeoutError):
    pass


class RequestLost(RequestTimeout):
    """The server restarted after the request was sent: no reply will come."""


def _configure(sock: zmq.Socket, hwm: int, max_bytes: int) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)


def bind_router(
    ctx: zmq.Context, endpoint: str, hwm: int = DEFAULT_HWM, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> zmq.Socket:
    """The server side. Bind to loopback unless the config says otherwise (see conf/)."""
    sock = ctx.socket(zmq.ROUTER)
    _configure(sock, hwm, max_bytes)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # replies to vanished peers are dropped, not raised
    secure_server(sock)  # CURVE + ZAP when security.curve (protocol/security.py)
    sock.bind(endpoint)
    return sock


@dataclass
class Request:
    """A decoded request with the routing identity needed to answer it, and under CURVE the role
    of the key it came with (protocol/security.py, sender_role; None without CURVE)."""

    identity: bytes
    message: Message
    sender: str | None = None


def recv_request(sock: zmq.Socket, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Request:
    """Receive one request on a ROUTER. A malformed one is answered with ErrorReply and re-raised
    as ProtocolError so the caller can count it; it never reaches application code."""
    frames = sock.recv_multipart(copy=False)
    identity = frames[0].bytes
    try:
        return Request(identity, decode(frames[1:], max_bytes), sender_role(frames[1]) if len(frames) > 1 else None)
    except ProtocolError as exc:
        send_reply(sock, identity, ErrorReply(reason=exc.reason, detail=str(exc)[:500]))
        raise


def send_reply(sock: zmq.Socket, identity: bytes, msg: Message) -> None:
    sock.send_multipart([identity, *encode(msg)], copy=False)


class Client:
    """A DEALER with one request in flight at a time, reconnecting after a timeout."""

    def __init__(
        self,
        ctx: zmq.Context,
        endpoint: str,
        timeout_s: float = 30.0,
        hwm: int = DEFAULT_HWM,
        max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        probe_after_s: float | None = None,
    ):
        self.ctx, self.endpoint, self.timeout_s = ctx, endpoint, timeout_s
        self.hwm, self.max_bytes = hwm, max_bytes
        # LIVENESS_PROBE_S unless given; 0: never probe, wait out the timeout
        self.probe_after_s = LIVENESS_PROBE_S if probe_after_s is None else probe_after_s
        self._sock: zmq.Socket | None = None
        self._sent_at = 0.0

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            self._sock = self.ctx.socket(zmq.DEALER)
            _configure(self._sock, self.hwm, self.max_bytes)
            secure_client(self._sock)
            self._sock.connect(self.endpoint)
        return self._sock

    def reset(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def send(self, msg: Message) -> None:
        self._socket().send_multipart(encode(msg), copy=False)
        self._sent_at = time.monotonic()

    def recv(self, timeout_s: float | None = None) -> Message:
        sock = self._socket()
        wait = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait
        probe_at = self._sent_at + self.probe_after_s if self.probe_after_s > 0 else float("inf")
        while not sock.poll(max(math.ceil((min(deadline, probe_at) - time.monotonic()) * 1000), 0), zmq.POLLIN):
            now = time.monotonic()
            if now >= deadline:
                self.reset()  # a late reply must not answer the next request
                raise RequestTimeout(f"no reply from {self.endpoint} within {wait:.1f}s")
            if now < probe_at:
                continue
            uptime = self._probe_uptime(min(PROBE_REPLY_S, deadline - now))
            waited = time.monotonic() - self._sent_at
            if 0 <= uptime < waited:
                self.reset()
                raise RequestLost(
                    f"{self.endpoint} restarted {uptime:.1f}s ago, after this request was sent {waited:.1f}s ago"
                )
            probe_at = time.monotonic() + self.probe_after_s
        reply = decode(sock.recv_multipart(copy=False), self.max_bytes)
        if isinstance(reply, ErrorReply):
            raise RemoteError(reply)
        return reply

    def _probe_uptime(self, timeout_s: float) -> float:
        """The server's Pong.uptime_s, asked on a socket of its own; -1 without an answer in time."""
        probe = self.ctx.socket(zmq.DEALER)
        try:
            _configure(probe, self.hwm, self.max_bytes)
            secure_client(probe)
            probe.connect(self.endpoint)
            probe.send_multipart(encode(Ping(sender="liveness-probe")), copy=False)
            if probe.poll(max(int(timeout_s * 1000), 1), zmq.POLLIN):
                pong = decode(probe.recv_multipart(copy=False), self.max_bytes)
                if isinstance(pong, Pong):
                    return pong.uptime_s
            return -1.0
        except ProtocolError:
            return -1.0
        finally:
            probe.close(linger=0)

    def call(self, msg: Message, timeout_s: float | None = None) -> Message:
        self.send(msg)
        return self.recv(timeout_s)

    def close(self) -> None:
        self.reset()


def wait_until_ready(
    client: Client,
    sender: str,
    timeout_s: float,
    poll_s: float = 1.0,
    on_wait: Callable[[float], None] | None = None,
) -> Pong:
    """Ping until the server says ready (handshake). Raises TimeoutError naming the endpoint."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pong = client.call(Ping(sender=sender), timeout_s=poll_s)
            if isinstance(pong, Pong) and pong.ready:
                return pong
        except RequestTimeout:
            pass
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{client.endpoint} not ready after {timeout_s:.0f}s")
        if on_wait is not None:
            on_wait(remaining)
        time.sleep(min(poll_s, max(remaining, 0)))
