"""The heartbeat writer (common/heartbeat.py): nothing before the first beat, at most one write per
MIN_INTERVAL_S however often the role beats, the file's mtime the oldest lane's last beat (one stuck
thread stops the process's heartbeat), and a no-op without a path."""

from __future__ import annotations

from common.heartbeat import Heartbeat, heartbeat_path, last_beat


class _Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_beats_are_written_at_most_once_a_second(tmp_path):
    clock = _Clock()
    heart = Heartbeat(min_interval_s=1.0, clock=clock)
    path = heartbeat_path(tmp_path, "env_actor0")
    heart.start(path)
    assert last_beat(path) is None  # started, not yet beaten: the launcher's start-up allowance
    heart.beat()
    assert heart.writes == 1 and last_beat(path) == clock.t
    first = clock.t
    for _ in range(50):  # 50 beats within 0.5 s: no write
        clock.t += 0.01
        heart.beat()
    assert heart.writes == 1 and last_beat(path) == first
    clock.t = first + 1.0
    heart.beat()
    assert heart.writes == 2 and last_beat(path) == clock.t


def test_the_oldest_lane_is_the_process_heartbeat(tmp_path):
    clock = _Clock()
    heart = Heartbeat(min_interval_s=1.0, clock=clock)
    path = tmp_path / "heartbeats" / "env_actor0"
    heart.start(path)
    heart.beat("actor0")
    heart.beat("actor0.1")
    stuck = clock.t
    for _ in range(5):  # actor0 goes on, actor0.1 is stuck
        clock.t += 1.5
        heart.beat("actor0")
    assert last_beat(path) == stuck
    heart.beat("actor0.1")  # it moves again (within the second: written with the next beat)
    clock.t += 1.0
    heart.beat("actor0")
    assert last_beat(path) == clock.t - 1.0


def test_without_a_path_a_beat_writes_nothing(tmp_path):
    heart = Heartbeat()
    heart.start("")
    heart.beat()
    assert heart.writes == 0 and not list(tmp_path.iterdir())
