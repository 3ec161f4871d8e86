"""The policy server's vLLM engine is shut down once (issue 26: a clean stop is clean): AsyncLLM's
__del__ shuts it down again, which after PolicyEngine.shutdown ran at the interpreter's exit, with
vLLM's module globals gone (`TypeError: 'NoneType' object is not callable`). Runs in a subprocess
(no engine is started: the object is made without __init__) and checks its stderr at exit."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytest.importorskip("vllm")

PROBE = """
import gc
from vllm.v1.engine.async_llm import AsyncLLM
from actors.policy_server.engine import _async_llm_class

calls = []
plain_shutdown = AsyncLLM.shutdown
AsyncLLM.shutdown = lambda self, timeout=None: calls.append(timeout)
engine = _async_llm_class().__new__(_async_llm_class())
engine.shutdown()  # PolicyEngine.shutdown
engine.shutdown(5.0)
del engine
gc.collect()  # AsyncLLM.__del__
print("base shutdowns", len(calls))
AsyncLLM.shutdown = plain_shutdown
kept = _async_llm_class().__new__(_async_llm_class())
kept.shutdown()  # then alive until the interpreter's exit, as the policy server's engine is
"""


def test_the_engine_is_shut_down_once_and_its_finalizer_is_quiet_at_exit():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "base shutdowns 1" in out.stdout
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]


def test_the_engine_core_is_given_time_to_stop_by_itself():
    """Issue 39: vLLM's client killed its engine core 5 s after the stop's SIGTERM (its default), in the
    middle of the core's teardown on a busy host, and the resource tracker it shares with the server
    then reported "1 leaked semaphore objects". The server gives it ENGINE_STOP_TIMEOUT_S, within the
    launcher's grace period, and the core waits WORKER_STOP_TIMEOUT_S for its worker."""
    from actors.policy_server.config import PolicyServerConfig
    from actors.policy_server.engine import ENGINE_STOP_TIMEOUT_S, WORKER_STOP_TIMEOUT_S, PolicyEngine
    from deploy.config import LaunchConfig

    timeouts = []

    class StandIn:
        def shutdown(self, timeout=None):
            timeouts.append(timeout)

    PolicyEngine("unused", PolicyServerConfig(), 0, "zmq", engine=StandIn()).shutdown()
    assert timeouts == [ENGINE_STOP_TIMEOUT_S]
    assert 5 < WORKER_STOP_TIMEOUT_S < ENGINE_STOP_TIMEOUT_S < LaunchConfig().stop_grace_s


CHILD_PROBE = """
import atexit, multiprocessing as mp, sys


class Cycle:
    def __del__(self):
        print("collected at exit", flush=True)


def child(plugin):
    if plugin:
        from actors.policy_server import worker_ext  # noqa: F401 (vLLM loads it as a plugin in its processes)
    global cycle, lock
    cycle = Cycle()
    cycle.me = cycle  # freed only by the interpreter's last collection
    lock = mp.get_context("spawn").Lock()  # registered with the resource tracker the parent shares
    atexit.register(print, "atexit ran", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    for plugin in (False, True):
        p = mp.get_context("spawn").Process(target=child, args=(plugin,))
        p.start()
        p.join()
        print("exit", plugin, p.exitcode, flush=True)
"""


def test_vllm_processes_end_like_forked_children(tmp_path):
    """Issue 39: the interpreter's last whole-heap collections made vLLM's worker and engine core
    overrun their stop timeouts on a 2-core host. A spawned process that loads the plugin ends as a
    forked child does: its atexit handlers and multiprocessing's finalizers run (its semaphore is
    unregistered: no leak warning), its exit status is kept, the last collections are skipped."""
    script = tmp_path / "child_probe.py"
    script.write_text(CHILD_PROBE)
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split("\n")
    assert lines == [
        "atexit ran",
        "collected at exit",
        "exit False 3",  # the control: the whole finalization
        "atexit ran",
        "exit True 3",
        "",
    ], out.stdout
    assert "leaked" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]


def test_the_worker_runs_in_the_engine_core_on_one_cpu_device_and_where_asked():
    from actors.policy_server.config import PolicyServerConfig
    from actors.policy_server.engine import executor_backend
    from common.config import ConfigError

    assert executor_backend(PolicyServerConfig(), "cpu") == "uni"  # auto on CPU: one process fewer
    assert executor_backend(PolicyServerConfig(), "cuda") is None  # vLLM's own choice
    assert executor_backend(PolicyServerConfig(tensor_parallel_size=2), "cuda") is None
    assert executor_backend(PolicyServerConfig(executor="mp"), "cpu") == "mp"
    with pytest.raises(ConfigError, match="executor"):
        PolicyServerConfig(executor="uni", tensor_parallel_size=2, device="cuda").validate()
