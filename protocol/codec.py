"""Typed messages <-> ZeroMQ multipart frames. No pickle, ever.

Wire layout of one message (after any ROUTER identity frame):

    frame 0   kind, ASCII (e.g. b"generate_request"): lets a receiver route or reject cheaply
    frame 1   msgpack map {"v": PROTOCOL_VERSION, "body": {...}}
    frame 2.. raw array buffers, in the order the body references them

Arrays inside the body are replaced by {"__nd__": i, "dtype": "int32", "shape": [...]}, where i
indexes frame 2+i (vLLM's serial_utils does the same for tensors): bulk data is never copied
into msgpack and is decoded with np.frombuffer, zero-copy.

Decoding is strict: unknown kind, other protocol version, unknown or missing fields, wrong field
types, disallowed dtypes, inconsistent buffer sizes and oversized messages all raise
ProtocolError with a short `reason` (used as a metric label) and a human-readable message.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Sequence
from typing import Any, ClassVar

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

# dtypes allowed on the wire. Weights in bf16/fp16 travel as uint8 views (numpy has no bf16).
ALLOWED_DTYPES = frozenset({"int32", "int64", "float32", "float16", "uint8"})
_ITEMSIZE = {name: np.dtype(name).itemsize for name in ALLOWED_DTYPES}
_DTYPE_NAMES = {np.dtype(name): name for name in ALLOWED_DTYPES}  # str(dtype) is slow, and runs per array
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_FRAMES = 4096
# A rejection's explanation quotes at most this much of anything it was given.
MAX_DETAIL_CHARS = 200


class ProtocolError(ValueError):
    """A message that cannot be accepted. `reason` is a short, stable label for metrics."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason


@dataclasses.dataclass
class Message:
    """Base of every wire message. Subclasses set KIND and declare typed fields."""

    KIND: ClassVar[str] = ""

    def validate(self) -> None:
        """Semantic checks beyond types; override and raise ProtocolError("invalid", ...)."""

    def check(self, limits: Any) -> None:
        """Checks against what the receiving server knows (protocol.messages.DoorLimits: vocab size,
        the run's tasks, text bounds); run at the server's door after validate(). Override."""


_REGISTRY: dict[str, type[Message]] = {}


def register(cls: type[Message]) -> type[Message]:
    if not cls.KIND or cls.KIND in _REGISTRY:
        raise TypeError(f"message class {cls.__name__} needs a unique KIND")
    _REGISTRY[cls.KIND] = cls
    return cls


def message_types() -> dict[str, type[Message]]:
    return dict(_REGISTRY)


# ---------------------------------------------------------------------------------------- encode


def encode(msg: Message) -> list[Any]:
    """Message -> frames [kind, header, *buffers]. Buffers are zero-copy views of the arrays."""
    buffers: list[memoryview] = []
    body = _to_wire(msg, buffers)
    header = msgpack.packb({"v": PROTOCOL_VERSION, "body": body}, use_bin_type=True)
    return [msg.KIND.encode("ascii"), header, *buffers]


_PLAIN = (str, int, float, bool, type(None), bytes)  # msgpack carries these as they are


def _to_wire(value: Any, buffers: list[memoryview]) -> Any:
    if type(value) in _PLAIN:  # the common case first: this runs once per field and list element
        return value
    if type(value) is list and all(type(v) is str for v in value):  # observations, actions, tips
        return value
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        buffers.append(memoryview(arr.reshape(-1).view(np.uint8)))  # flat bytes, zero-copy
        dtype = _DTYPE_NAMES.get(arr.dtype) or str(arr.dtype)
        return {"__nd__": len(buffers) - 1, "dtype": dtype, "shape": list(arr.shape)}
    if dataclasses.is_dataclass(value):
        return {name: _to_wire(getattr(value, name), buffers) for name in _field_names(type(value))}
    if isinstance(value, (list, tuple)):
        return [_to_wire(v, buffers) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v, buffers) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


# ---------------------------------------------------------------------------------------- decode


def decode(frames: Sequence[Any], max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Message:
    """frames -> Message, or ProtocolError. Never lets a malformed input escape as another error."""
    try:
        return _decode(frames, max_bytes)
    except ProtocolError:
        raise
    except Exception as exc:  # defensive: any parser surprise is a rejected message, not a crash
        # bounded: a parser's message may quote the input (msgpack's ExtraData holds the data)
        raise ProtocolError("malformed", f"{type(exc).__name__}: {str(exc)[:MAX_DETAIL_CHARS]}") from None


def _decode(frames: Sequence[Any], max_bytes: int) -> Message:
    if len(frames) < 2:
        raise ProtocolError("malformed", f"expected at least 2 frames, got {len(frames)}")
    if len(frames) > MAX_FRAMES:
        raise ProtocolError("too_large", f"{len(frames)} frames > {MAX_FRAMES}")
    raw = [f.buffer if hasattr(f, "buffer") else f for f in frames]  # zmq.Frame -> memoryview
    total = sum(len(memoryview(f).cast("B")) for f in raw)
    if total > max_bytes:
        raise ProtocolError("too_large", f"{total} bytes > limit {max_bytes}")
    kind = bytes(raw[0]).decode("ascii", errors="replace")
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise ProtocolError("unknown_kind", f"unknown message kind {kind[:64]!r}")
    header = msgpack.unpackb(raw[1], raw=False, strict_map_key=True, use_list=True, ext_hook=_reject_ext)
    if not isinstance(header, dict) or set(header) != {"v", "body"}:
        raise ProtocolError("malformed", "header must be a map with keys 'v' and 'body'")
    if type(header["v"]) is not int or header["v"] != PROTOCOL_VERSION:
        raise ProtocolError("bad_version", f"protocol version {header['v']!r}, this process speaks {PROTOCOL_VERSION}")
    buffers = [memoryview(f).cast("B") for f in raw[2:]]
    used: set[int] = set()
    msg = _from_wire(cls, header["body"], buffers, used, kind)  # validates every message in it
    if len(used) != len(buffers):
        raise ProtocolError("malformed", f"{len(buffers) - len(used)} unreferenced buffer frames")
    return msg


def _reject_ext(code: int, data: bytes) -> Any:
    raise ProtocolError("malformed", f"msgpack extension type {code} is not allowed")


def _from_wire(tp: Any, value: Any, buffers: list[memoryview], used: set[int], path: str) -> Any:
    # scalars first (most fields): no typing introspection on the hot path
    if tp is str or tp is bool:
        if not isinstance(value, tp):
            raise ProtocolError("schema", f"{path}: expected {tp.__name__}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError("schema", f"{path}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError("schema", f"{path}: expected a number")
        return float(value)
    if tp is np.ndarray:
        return _array_from_wire(value, buffers, used, path)
    origin = _origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return _from_wire(inner, value, buffers, used, path)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ProtocolError("schema", f"{path}: expected a map for {tp.__name__}")
        hints, required = _schema(tp)
        unknown = value.keys() - hints.keys()
        missing = required - value.keys()
        if unknown or missing:
            raise ProtocolError("schema", f"{path}: unknown fields {sorted(unknown)}, missing {sorted(missing)}")
        kwargs = {name: _from_wire(hints[name], v, buffers, used, f"{path}.{name}") for name, v in value.items()}
        obj = tp(**kwargs)
        if isinstance(obj, Message):  # nested messages too (a Batch's trajectories)
            obj.validate()
        return obj
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError("schema", f"{path}: expected a list")
        (inner,) = typing.get_args(tp)
        if inner is str and all(type(v) is str for v in value):  # observations, actions, tips: one pass
            return value
        return [_from_wire(inner, v, buffers, used, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_t, val_t = typing.get_args(tp)
        if not isinstance(value, dict) or not all(isinstance(k, key_t) for k in value):
            raise ProtocolError("schema", f"{path}: expected a map of {key_t.__name__} keys")
        return {k: _from_wire(val_t, v, buffers, used, f"{path}[{k}]") for k, v in value.items()}
    raise TypeError(f"unsupported field type {tp!r} at {path}")  # a bug in a message class


def _required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


@functools.cache
def _origin(tp: Any) -> Any:
    return typing.get_origin(tp)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _schema(tp: type) -> tuple[dict[str, Any], frozenset[str]]:
    """(field name -> resolved type, required field names) of a message or nested dataclass, computed
    once per class: typing.get_type_hints was two thirds of decoding a GenerateRequest (issue 14)."""
    hints = typing.get_type_hints(tp)
    fields = dataclasses.fields(tp)
    return {f.name: hints[f.name] for f in fields}, frozenset(f.name for f in fields if _required(f))


def _array_from_wire(value: Any, buffers: list[memoryview], used: set[int], path: str) -> np.ndarray:
    if not isinstance(value, dict) or set(value) != {"__nd__", "dtype", "shape"}:
        raise ProtocolError("schema", f"{path}: expected an array reference")
    index, dtype, shape = value["__nd__"], value["dtype"], value["shape"]
    if type(index) is not int or not 0 <= index < len(buffers) or index in used:
        raise ProtocolError("malformed", f"{path}: bad or reused buffer index {index!r}")
    itemsize = _ITEMSIZE.get(dtype) if isinstance(dtype, str) else None
    if itemsize is None:
        raise ProtocolError("schema", f"{path}: dtype {str(dtype)[:32]!r} not allowed")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ProtocolError("schema", f"{path}: bad shape {str(shape)[:64]}")
    buf = buffers[index]
    expected = math.prod(shape) * itemsize
    if expected != len(buf):
        raise ProtocolError("malformed", f"{path}: shape {shape} {dtype} needs {expected} bytes, got {len(buf)}")
    used.add(index)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


# ----------------------------------------------------------------------- records at rest


def pack_frames(frames: Sequence[Any]) -> bytes:
    """One encoded message as a single blob (for append-only logs): a msgpack array of bins."""
    return msgpack.packb([bytes(f) for f in frames], use_bin_type=True)


def unpack_frames(blob: bytes) -> list[bytes]:
    frames = msgpack.unpackb(blob, raw=False, ext_hook=_reject_ext)
    if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
        raise ProtocolError("malformed", "record is not a list of frames")
    return frames
