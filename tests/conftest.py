"""A test run that is stopped stops what it started, as one that ends does.

pytest runs fixture finalizers (and `finally` blocks) on Ctrl-C, which raises KeyboardInterrupt,
but not on SIGTERM (`timeout`, a CI runner, a terminal closed), which ends the process at once: the
launchers, policy servers, JVMs and Prometheus of its fixtures ran on, holding the ports and the
cores, with the learner's shared-memory weight file left in /dev/shm. So SIGTERM takes the Ctrl-C
path here. What a finalizer still misses (a test's process without one, a finalizer cut short) is found
at the end by the mark every process of the run inherits (tests/helpers.py) and stopped the way
the launcher stops a role.

A test phase (setup, call, teardown) that runs past EMPO2_TEST_TIMEOUT_S (default 900 s; the
longest phase of `make test` on record took 120 s; `make test-long` allows 3600) fails, with every
thread's stack on stderr, instead of eating the CI's whole budget: a hang once did (a socket left
open blocked zmq's Context.term() for 80 minutes).

Also the `stub_server` fixture: a real ZeroMQ ROUTER answering with a function (tests/helpers.py,
StubServer), for the unit tests of a role's client side.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import secrets
import signal
import sys
from collections.abc import Callable, Iterator

import pytest

from protocol import Message
from tests.helpers import TEST_RUN_ENV, StubServer, stop_marked_processes

MARK = f"pytest-{os.getpid()}-{secrets.token_hex(4)}"
PHASE_TIMEOUT_S = float(os.environ.get("EMPO2_TEST_TIMEOUT_S", "900"))


def _interrupt(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop: the clean-up is not cut short by a second
    raise KeyboardInterrupt


def pytest_configure(config) -> None:
    os.environ[TEST_RUN_ENV] = f"{os.environ.get(TEST_RUN_ENV, '')} {MARK}".strip()
    signal.signal(signal.SIGTERM, _interrupt)


@contextlib.contextmanager
def _deadline(item, phase: str) -> Iterator[None]:
    def expire(signum, frame) -> None:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        # pytest.fail raises a BaseException: no `except Exception` on the hung path swallows it
        pytest.fail(f"{item.nodeid}: {phase} ran past {PHASE_TIMEOUT_S:.0f} s (EMPO2_TEST_TIMEOUT_S)", pytrace=True)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, PHASE_TIMEOUT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _deadline(item, "setup"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _deadline(item, "call"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _deadline(item, "teardown"):
        return (yield)


def pytest_unconfigure(config) -> None:
    left = stop_marked_processes(MARK)
    if left:
        print(f"\n[tests] stopped {len(left)} processes the tests left running:", file=sys.stderr)
        for pid, command in left.items():
            print(f"  {pid}: {command[:200]}", file=sys.stderr)


@pytest.fixture
def stub_server():
    """stub_server(answer, endpoint=None) -> a started StubServer, closed after the test."""
    started: list[StubServer] = []

    def start(answer: Callable[[Message], Message], endpoint: str | None = None) -> StubServer:
        started.append(StubServer(answer, endpoint))
        return started[-1]

    yield start
    for server in started:
        server.close()
