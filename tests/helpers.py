"""What the tests share besides their inputs (testing/factories.py): the repository root, free
loopback ports, a stub ZeroMQ server, waiting for a condition, the learner's log-probs of a response, a raw CURVE probe,
and the mark that every process a test run starts carries, so that the run can stop them all
(tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import zmq

from common.process import orphaned_semaphores, shm_files, unlink_unmapped
from protocol import Message, bind_router, encode, recv_request, send_reply
from protocol.messages import Ping

REPO = Path(__file__).resolve().parents[1]
# Set by tests/conftest.py to the run's marks (an outer test run's first, when one pytest runs
# another): inherited by every process the run starts, the launcher's roles and their vLLM workers
# and JVMs included, so the processes of a run are found by their environment.
TEST_RUN_ENV = "EMPO2_TEST_RUN"


# The fixed ports of the integration tests (endpoints and metrics.base_port blocks) lie below 32768:
# Linux's ephemeral range (32768..60999 by default) hands its ports to outgoing connections, which
# made a test's bind fail now and then with "Address already in use".


def free_port() -> int:
    """A loopback TCP port nothing listens on (yet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def wait_for(condition: Callable[[], object], timeout_s: float = 5.0, poll_s: float = 0.01) -> bool:
    """True once condition() is true, asked every `poll_s`; False after `timeout_s` (a server
    thread records what it was sent a moment after the client has its reply)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def logprobs(model, prompt: Sequence[int], response: Sequence[int], temperature: float = 1.0) -> np.ndarray:
    """The model's log-probs of `response`'s tokens after `prompt` (float32 [len(response)]) at the
    temperature they were sampled at, as the learner scores them (learner.policy_model.response_logprobs),
    without a graph."""
    import torch

    from learner.policy_model import response_logprobs

    with torch.no_grad():
        out = response_logprobs(
            model,
            torch.as_tensor(np.asarray(prompt, np.int64)),
            torch.as_tensor(np.asarray(response, np.int64)),
            temperature,
        )
    return out.numpy().astype(np.float32)


def ping_answered(endpoint: str, options: dict, timeout_ms: int = 1500) -> bool:
    """True if a DEALER with these socket options (none: no CURVE; a key pair of its own: an
    unlisted key, ...) got any answer to a Ping within `timeout_ms`."""
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


def marked_processes(mark: str) -> dict[int, str]:
    """pid -> command line of every living process whose environment carries `mark` in
    TEST_RUN_ENV (this process excepted)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone, or not ours
            continue
        marks = next((v for k, _, v in (e.partition(b"=") for e in environ) if k == TEST_RUN_ENV.encode()), b"")
        if mark.encode() in marks.split() and cmdline:  # a zombie has no command line: it is gone
            found[int(entry.name)] = cmdline
    return found


def stop_marked_processes(mark: str, grace_s: float = 20.0) -> dict[int, str]:
    """Stop every process carrying `mark` as the roles are stopped: SIGTERM to its process group
    (to itself where it shares this process's group), SIGKILL to what is left after `grace_s`, then
    the shared memory they mapped and the semaphores of dead processes unlinked; what was found."""
    found = marked_processes(mark)
    if not found:
        return found
    shm = shm_files(found)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in marked_processes(mark):
            try:
                group = os.getpgid(pid)
                if group == os.getpgrp():
                    os.kill(pid, sig)
                else:
                    os.killpg(group, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while marked_processes(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
    unlink_unmapped(shm | orphaned_semaphores())
    return found


class StubServer:
    """A ROUTER at `endpoint` answering every request with `answer(message)`; `received` holds
    the messages in arrival order."""

    def __init__(self, answer: Callable[[Message], Message], endpoint: str | None = None):
        self.endpoint = endpoint or free_endpoint()
        self.sock = bind_router(zmq.Context.instance(), self.endpoint)
        self.answer, self.received = answer, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if self.sock.poll(10, zmq.POLLIN):
                request = recv_request(self.sock)
                self.received.append(request.message)
                send_reply(self.sock, request.identity, self.answer(request.message))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close(linger=0)


def run_to_its_end(overrides: list[str], run_dir: Path, timeout_s: float):
    """An `empo2-run` (testing/harness.py's LaunchedRun) to its step target, always stopped after; asserts it
    ended `done` with every server at learner.total_steps. (the run, its summary.json)."""
    import json

    from testing.harness import LaunchedRun

    run = LaunchedRun(overrides, run_dir, timeout_s, cwd=REPO)
    try:
        assert run.wait() == 0, run.tail()
    finally:
        run.stop(grace_s=120)
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["outcome"] == "done" and summary["policy_version"] == run.cfg.learner.total_steps, summary
    return run, summary
