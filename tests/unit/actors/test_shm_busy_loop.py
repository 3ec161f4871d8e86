"""The cap on vLLM's shared-memory reader (actors/policy_server/worker_ext.cap_shm_busy_loop), on vLLM's own
SpinCondition with real zmq sockets: a reader whose write notification never comes looks at the
queue again after IDLE_RECHECK_MS instead of sleeping vLLM's 5 s recheck interval. Runs in a
subprocess: the cap patches vLLM's class for the whole process."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("vllm")

PROBE = """
import os, time, zmq
from vllm.distributed.device_communicators import shm_broadcast
from actors.policy_server import worker_ext

ctx = zmq.Context()
address = "ipc:///tmp/empo2-spin-probe-%d" % os.getpid()
writer = shm_broadcast.SpinCondition(False, ctx, address)  # binds; never notifies
reader = shm_broadcast.SpinCondition(True, ctx, address, busy_loop_s=1)
reader.last_read = 0.0  # long idle: the next wait goes to the socket

t = time.monotonic(); reader.wait(timeout_ms=1500); plain = time.monotonic() - t
os.environ["EMPO2_VLLM_BUSY_LOOP_S"] = "0"
worker_ext.cap_shm_busy_loop()
t = time.monotonic(); reader.wait(timeout_ms=5000); capped = time.monotonic() - t
t = time.monotonic(); reader.wait(timeout_ms=None); indefinite = time.monotonic() - t
print(plain, capped, indefinite, reader.busy_loop_s)
"""


def test_capped_reader_rechecks_instead_of_sleeping_out_a_missed_notification():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    plain, capped, indefinite, busy_loop_s = map(float, out.stdout.split()[-4:])
    assert plain >= 1.4  # vLLM's own wait sleeps the whole timeout without a notification
    assert capped < 1.0 and indefinite < 1.0  # capped: back to check the queue within IDLE_RECHECK_MS
    assert busy_loop_s == 0.0
