"""The buffer log under faults (issue 14): a truncated tail, a corrupted length, a corrupted payload,
an unknown tag. Every intact acknowledged record survives the restart, the corrupt one is skipped
and counted (in the replay's result, the process's metrics and its log), and intact data is never
cut from the file."""

from __future__ import annotations

import logging
import os

import pytest

from protocol.codec import encode
from protocol.records import HEADER_BYTES, RECORD_MAGIC, frame_record, scan
from replay_buffer.buffer import LOG_TAGS, BufferLog
from replay_buffer.config import Durability
from testing.factories import make_buffer, make_traj

RECORDS = 6  # trajectories of group "g" (group_size 8: the group stays open)


def write_log(path, durability=Durability.flush) -> list[int]:
    """RECORDS trajectory records; returns each record's start offset."""
    log = BufferLog(path, durability)
    starts = []
    for slot in range(RECORDS):
        starts.append(path.stat().st_size)
        log.append_trajectory(encode(make_traj("g", slot)))
    log.close()
    return starts


def flip(path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def replay(path):
    buffer = make_buffer(group_size=8)
    return buffer, BufferLog.replay(path, buffer)


def slots(buffer) -> list[int]:
    return sorted(buffer.open["g"].trajectories)


def test_an_intact_log_replays_every_record(tmp_path):
    path = tmp_path / "buffer.log"
    write_log(path)
    buffer, result = replay(path)
    assert result.records == RECORDS and result.skipped == {} and slots(buffer) == list(range(RECORDS))


@pytest.mark.parametrize("cut", [1, 30, HEADER_BYTES - 3])
def test_truncated_tail_loses_only_the_torn_record_and_is_cut(tmp_path, cut):
    path = tmp_path / "buffer.log"
    starts = write_log(path)
    size = path.stat().st_size
    path.write_bytes(
        path.read_bytes()[: size - cut] if cut != HEADER_BYTES - 3 else path.read_bytes()[: starts[-1] + cut]
    )
    buffer, result = replay(path)
    assert slots(buffer) == list(range(RECORDS - 1))
    assert result.skipped == {"torn_tail": 1}
    assert path.stat().st_size == starts[-1]  # only the torn bytes were cut


@pytest.mark.parametrize("victim", [0, 2, RECORDS - 1])
def test_corrupted_length_skips_that_record_and_keeps_every_one_after_it(tmp_path, victim):
    """A flipped bit in a record's length field: the header checksum catches it before the length
    is trusted (it used to make the rest of the file look like a torn tail and be truncated)."""
    path = tmp_path / "buffer.log"
    starts = write_log(path)
    size = path.stat().st_size
    flip(path, starts[victim] + 5 + 2, 0x40)  # the length's third byte: +4 MiB
    buffer, result = replay(path)
    expected = [s for s in range(RECORDS) if s != victim]
    assert slots(buffer) == expected
    if victim == RECORDS - 1:  # nothing intact after it: indistinguishable from a torn tail
        assert result.skipped == {"torn_tail": 1}
    else:
        assert result.skipped == {"bad_header": 1} and result.truncated_bytes == 0
        assert path.stat().st_size == size  # nothing cut


def test_corrupted_payload_is_skipped_not_fatal(tmp_path):
    """One flipped payload byte used to stop the buffer at start-up (msgpack ExtraData)."""
    path = tmp_path / "buffer.log"
    starts = write_log(path)
    flip(path, starts[3] + HEADER_BYTES + 40)
    buffer, result = replay(path)
    assert slots(buffer) == [0, 1, 2, 4, 5]
    assert result.skipped == {"bad_checksum": 1}
    assert result.skipped_bytes == starts[4] - starts[3]


def test_unknown_tag_is_skipped_and_counted(tmp_path):
    path = tmp_path / "buffer.log"
    write_log(path)
    with open(path, "ab") as f:
        f.write(frame_record(b"X", b"from a newer buffer"))
    log = BufferLog(path, Durability.flush)
    log.append_trajectory(encode(make_traj("g", 7)))
    log.close()
    buffer, result = replay(path)
    assert slots(buffer) == [0, 1, 2, 3, 4, 5, 7]
    assert result.skipped == {"unknown_tag": 1}


def test_an_intact_record_that_does_not_decode_is_skipped(tmp_path):
    path = tmp_path / "buffer.log"
    write_log(path)
    with open(path, "ab") as f:
        f.write(frame_record(b"T", b"\x93\xc4\x01a\xc4\x01b"))  # three frames, not a message
    buffer, result = replay(path)
    assert slots(buffer) == list(range(RECORDS)) and result.skipped == {"undecodable": 1}


def test_several_faults_at_once_and_appends_after_them_survive_the_next_restart(tmp_path):
    path = tmp_path / "buffer.log"
    starts = write_log(path)
    flip(path, starts[1] + 6)  # length
    flip(path, starts[4] + HEADER_BYTES + 10)  # payload
    buffer, result = replay(path)
    assert slots(buffer) == [0, 2, 3, 5]
    assert result.skipped == {"bad_header": 1, "bad_checksum": 1}
    log = BufferLog(path, Durability.flush)  # the restarted buffer appends after the corrupt records
    log.append_trajectory(encode(make_traj("g", 6)))
    log.close()
    buffer, result = replay(path)
    assert slots(buffer) == [0, 2, 3, 5, 6]


def test_scan_resynchronises_on_the_magic_after_garbage(tmp_path):
    good = frame_record(b"T", b"payload")
    data = good + b"garbage" + RECORD_MAGIC + b"half a header" + good
    found = scan(data, LOG_TAGS)
    assert found.records == [(b"T", b"payload")] * 2
    assert found.skipped == {"bad_magic": 1} and found.torn_tail_bytes == 0


def test_a_log_without_checksums_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "buffer.log"
    path.write_bytes(b"T" + (5).to_bytes(8, "little") + b"hello")  # the format before checksums
    with pytest.raises(RuntimeError, match="not a checksummed buffer log"):
        replay(path)


@pytest.mark.parametrize("durability", list(Durability))
def test_every_durability_level_writes_the_same_log(tmp_path, durability):
    path = tmp_path / "buffer.log"
    write_log(path, durability)
    buffer, result = replay(path)
    assert result.records == RECORDS and slots(buffer) == list(range(RECORDS))


def test_fsync_durability_syncs_every_record_and_group_only_on_sync(tmp_path):
    log = BufferLog(tmp_path / "a.log", Durability.fsync)
    for slot in range(3):
        log.append_trajectory(encode(make_traj("g", slot)))
    assert log.fsyncs == 3 and log.unsynced == 0
    log.close()
    log = BufferLog(tmp_path / "b.log", Durability.group)
    for slot in range(3):
        log.append_trajectory(encode(make_traj("g", slot)))
    assert log.fsyncs == 0 and log.unsynced == 3
    log.sync()
    assert log.fsyncs == 1 and log.unsynced == 0
    log.close()


def test_buffer_process_reports_skipped_records_in_its_log_and_metrics(tmp_path, caplog):
    from pipeline.config import load_config, run_facts
    from replay_buffer.service import BufferProcess

    cfg = load_config([f"run_dir={tmp_path}", "replay_buffer.tasks=[boil]", "replay_buffer.group_size=8"])
    path = tmp_path / cfg.replay_buffer.log_file
    starts = write_log(path)
    flip(path, starts[2] + HEADER_BYTES + 3)
    with caplog.at_level(logging.WARNING, logger="replay_buffer"):
        process = BufferProcess(cfg.replay_buffer, run_facts(cfg), {"boil": [4]})
    process.log.close()
    sample = process.metrics.registry.get_sample_value
    assert sample("empo2_replay_buffer_log_records_skipped_total", {"fault": "bad_checksum"}) == 1
    assert sample("empo2_replay_buffer_log_records_replayed") == RECORDS - 1
    assert "skipped 1 corrupt records (bad_checksum 1" in caplog.text
    assert os.path.getsize(path) == starts[-1] + (starts[1] - starts[0])  # nothing cut
