"""A raw client for the CURVE tests (unit and end to end): does a server answer a Ping from a DEALER
with these socket options (none: no CURVE; a key pair of its own: an unlisted key, ...)?"""

from __future__ import annotations

import zmq

from protocol import encode
from protocol.messages import Ping


def ping_answered(endpoint: str, options: dict, timeout_ms: int = 1500) -> bool:
    """True if a DEALER with these socket options got any answer to a Ping within `timeout_ms`."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for option, value in options.items():
        sock.setsockopt(option, value)
    sock.connect(endpoint)
    try:
        sock.send_multipart(encode(Ping(sender="intruder")))
        return bool(sock.poll(timeout_ms))
    finally:
        sock.close(linger=0)
        ctx.term()
