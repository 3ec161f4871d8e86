"""Records at rest: the framing of an append-only log (the replay buffer's), so that one bad
record costs that record only.

Each record is a 17-byte header and its payload:

    magic    4 bytes  RECORD_MAGIC: where a record starts (a reader resynchronises on it)
    tag      1 byte   what the payload is (the log's owner gives the tags their meaning)
    length   uint32   payload bytes (little-endian, like the rest)
    crc      uint32   crc32 of the payload
    hcrc     uint32   crc32 of the 13 bytes before it: a flipped bit in the length is caught
                      before the length is trusted

`scan` reads a whole log: every intact record (both checksums right) is returned, wherever it
lies; bytes that do not form one are skipped up to the next magic that starts an intact record
and counted by what was wrong. Only bytes after the last intact record that form no record (a
write torn by a crash) are reported as a torn tail, for the owner to cut before appending.
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

RECORD_MAGIC = b"\xe9R2\x00"  # not ASCII, not msgpack's usual first byte of a frame list
_HEADER = struct.Struct("<4scII")  # magic, tag, length, payload crc; then the header crc
_HCRC = struct.Struct("<I")
HEADER_BYTES = _HEADER.size + _HCRC.size  # 17
# A record longer than this is taken for a corrupted length even when it fits the file (the
# protocol's biggest message is far smaller).
MAX_RECORD_BYTES = 1 << 31


def frame_record(tag: bytes, payload: bytes) -> bytes:
    """One record: header + payload, ready to append."""
    head = _HEADER.pack(RECORD_MAGIC, tag, len(payload), zlib.crc32(payload))
    return head + _HCRC.pack(zlib.crc32(head)) + payload


@dataclass
class Scan:
    """What a log holds: its intact records in order, and what was skipped."""

    records: list[tuple[bytes, bytes]] = field(default_factory=list)  # (tag, payload) of intact records
    skipped: Counter = field(default_factory=Counter)  # fault -> records (or stretches of bytes) skipped
    skipped_bytes: int = 0  # bytes skipped before intact records (kept in the file, never cut)
    intact_end: int = 0  # offset after the last intact record
    torn_tail_bytes: int = 0  # bytes after intact_end that form no record

    @property
    def faults(self) -> int:
        return sum(self.skipped.values())


def _record_at(data: memoryview, pos: int) -> tuple[str | None, int]:
    """(None, end) if an intact record starts at `pos`; else (fault, 0). Faults: bad_magic,
    bad_header (header checksum: e.g. a corrupted length), truncated (runs past the end),
    bad_checksum (payload)."""
    if len(data) - pos < HEADER_BYTES:
        return "truncated", 0
    magic, _, length, crc = _HEADER.unpack_from(data, pos)
    if magic != RECORD_MAGIC:
        return "bad_magic", 0
    (hcrc,) = _HCRC.unpack_from(data, pos + _HEADER.size)
    if zlib.crc32(data[pos : pos + _HEADER.size]) != hcrc or length > MAX_RECORD_BYTES:
        return "bad_header", 0
    end = pos + HEADER_BYTES + length
    if end > len(data):
        return "truncated", 0
    if zlib.crc32(data[pos + HEADER_BYTES : end]) != crc:
        return "bad_checksum", 0
    return None, end


def _next_intact(data: bytes, start: int) -> int:
    """Offset of the next intact record at or after `start`, or -1."""
    pos = data.find(RECORD_MAGIC, start)
    while pos >= 0:
        if _record_at(memoryview(data), pos)[0] is None:
            return pos
        pos = data.find(RECORD_MAGIC, pos + 1)
    return -1


def scan(data: bytes, known_tags: Iterable[bytes]) -> Scan:
    """Every intact record of `data` with a known tag; everything else skipped and counted
    (an intact record of an unknown tag as `unknown_tag`)."""
    known, view, result, pos = set(known_tags), memoryview(data), Scan(), 0
    while pos < len(data):
        fault, end = _record_at(view, pos)
        if fault is None:
            tag, payload = data[pos + 4 : pos + 5], data[pos + HEADER_BYTES : end]
            if tag in known:
                result.records.append((tag, payload))
            else:
                result.skipped["unknown_tag"] += 1
            pos = result.intact_end = end
            continue
        resume = _next_intact(data, pos + 1)
        if resume < 0:  # nothing intact after it: a torn tail
            result.torn_tail_bytes = len(data) - pos
            result.skipped["torn_tail"] += 1
            break
        result.skipped[fault] += 1
        result.skipped_bytes += resume - pos
        pos = resume
    return result
