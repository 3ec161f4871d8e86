"""Socket conventions: every service is a ROUTER that binds; every client is a DEALER that connects.

One request, one reply. Servers never block on a client (ROUTER drops replies to vanished peers);
clients bound every wait with a timeout and, after a timeout, throw their socket away (the "lazy
pirate" pattern) so a late reply can never be taken for the answer to a later request.

High-water marks and the per-socket message size limit are explicit. ZMQ_MAXMSGSIZE makes libzmq
drop a peer that sends a frame over the limit before it is buffered; `decode` checks the total.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from protocol.codec import DEFAULT_MAX_MESSAGE_BYTES, Message, ProtocolError, decode, encode
from protocol.messages import ErrorReply, Ping, Pong
from protocol.security import secure_client, secure_server, sender_role

log = logging.getLogger(__name__)

DEFAULT_HWM = 1000


class RemoteError(RuntimeError):
    """The server answered with ErrorReply."""

    def __init__(self, reply: ErrorReply):
        super().__init__(f"{reply.reason}: {reply.detail}")
        self.reason = reply.reason


class RequestTimeout(TimeoutError):
    pass


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
    ):
        self.ctx, self.endpoint, self.timeout_s = ctx, endpoint, timeout_s
        self.hwm, self.max_bytes = hwm, max_bytes
        self._sock: zmq.Socket | None = None

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

    def recv(self, timeout_s: float | None = None) -> Message:
        sock = self._socket()
        wait = self.timeout_s if timeout_s is None else timeout_s
        if not sock.poll(int(wait * 1000), zmq.POLLIN):
            self.reset()  # a late reply must not answer the next request
            raise RequestTimeout(f"no reply from {self.endpoint} within {wait:.1f}s")
        reply = decode(sock.recv_multipart(copy=False), self.max_bytes)
        if isinstance(reply, ErrorReply):
            raise RemoteError(reply)
        return reply

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
