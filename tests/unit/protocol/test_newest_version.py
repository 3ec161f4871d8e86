"""protocol/newest_version.py: the run's newest policy version as a file, read back; a file that
holds no version reads as 0 (the server then serves at once) instead of stopping the server."""

from __future__ import annotations

from protocol.newest_version import NEWEST_VERSION_FILE, publish_newest_version, read_newest_version


def test_the_newest_version_file_reads_back_and_a_bad_one_reads_as_zero(tmp_path):
    assert read_newest_version(tmp_path) == 0  # a new run
    publish_newest_version(tmp_path, 7)
    assert read_newest_version(tmp_path) == 7 and [p.name for p in tmp_path.iterdir()] == [NEWEST_VERSION_FILE]
    for bad in ("seven", "-3", ""):
        (tmp_path / NEWEST_VERSION_FILE).write_text(bad)
        assert read_newest_version(tmp_path) == 0
