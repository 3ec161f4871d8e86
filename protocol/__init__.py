"""The single source of the wire format: typed messages (messages.py), their msgpack+raw-frame
encoding (codec.py) and the socket conventions (transport.py). See protocol/README.md."""

from protocol.codec import PROTOCOL_VERSION, Message, ProtocolError, decode, encode
from protocol.messages import *  # noqa: F401,F403  (the message classes are the public API)
from protocol.transport import Client, RemoteError, RequestTimeout, bind_router, recv_request, send_reply

__all__ = [
    "PROTOCOL_VERSION",
    "Message",
    "ProtocolError",
    "decode",
    "encode",
    "Client",
    "RemoteError",
    "RequestTimeout",
    "bind_router",
    "recv_request",
    "send_reply",
]
