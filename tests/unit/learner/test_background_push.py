"""Background weight pushes (learner/weight_push.py, BackgroundPushes; issue 26): the learner's submit
returns at once; each server gets the newest version from a thread of its own; a hung server holds no
one and, once it answers, gets the newest version, not the ones in between; a restarted one gets the
newest again on resend. Against stub servers over real ZeroMQ sockets."""

from __future__ import annotations

import threading
import time

import torch

import learner.weight_push as weight_push
from learner.weight_push import BackgroundPushes, build_chunks, snapshot
from protocol.messages import WeightChunk, WeightUpdateAck


def chunks(version: int) -> list[WeightChunk]:
    return build_chunks([("w", torch.full((4,), float(version)))], version, chunk_bytes=1 << 20)


def applying(received: list[int], hang: threading.Event | None = None):
    def answer(msg):
        if hang is not None:
            hang.wait(30)  # as a SIGSTOPped server: no answer until it is continued
        assert isinstance(msg, WeightChunk)
        received.append(msg.version)
        return WeightUpdateAck(version=msg.version, chunk_index=msg.chunk_index, applied=True)

    return answer


def test_a_hung_server_holds_no_one_and_gets_only_the_newest_version_once_it_answers(stub_server, monkeypatch):
    monkeypatch.setattr(weight_push, "NOT_READY_RETRY_S", 0.1)
    healthy, hung, hang = [], [], threading.Event()
    servers = [stub_server(applying(healthy)), stub_server(applying(hung, hang))]
    pushes = BackgroundPushes([s.endpoint for s in servers], timeout_s=0.5)
    try:
        t0 = time.monotonic()
        for version in (1, 2, 3):
            pushes.submit(version, chunks(version))
            time.sleep(0.05)
        assert time.monotonic() - t0 < 0.5  # submit never waits for a server
        assert pushes.wait(3, timeout_s=5) is False  # the hung one has not confirmed
        assert pushes.acked[0] == 3 and pushes.acked[1] == -1 and pushes.backlog() >= 1
        hang.set()  # continued: the queued request of v1 answered into the void, then the newest
        assert pushes.wait(3, timeout_s=10)
        assert hung[-1] == 3 and 2 not in hung  # never the version in between
        assert healthy == sorted(healthy) and healthy[-1] == 3
        time.sleep(1.0)  # the retries it queued while hung are answered too (the same v3)
        assert set(hung[hung.index(3) :]) == {3}
        hung.clear()
        pushes.resend(1)  # it restarted: the newest again
        deadline = time.monotonic() + 5
        while not hung and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(hung) == {3}
    finally:
        pushes.close()


def test_a_snapshot_does_not_change_with_the_weights():
    w = torch.zeros(3)
    [(_, copy)] = snapshot([("w", w)])
    sent = build_chunks([("w", copy)], 1, chunk_bytes=1 << 20)
    w.add_(1.0)  # the next optimizer step
    assert sent[0].data[0].tobytes() == torch.zeros(3).numpy().tobytes()
    live = build_chunks([("w", w)], 2, chunk_bytes=1 << 20)
    w.add_(1.0)
    assert live[0].data[0].tobytes() != torch.ones(3).numpy().tobytes()  # without it: the live tensor
