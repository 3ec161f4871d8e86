"""Process plumbing shared by every role: signals become clean exits, so `finally` blocks run
(closing ScienceWorld's JVMs, flushing stores) when the launcher or systemd stops a process."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def signal_group(process: subprocess.Popen, sig: int) -> None:
    """Signal the process group of a child started with start_new_session=True."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_group(process: subprocess.Popen, deadline: float) -> bool:
    """Wait until every process of the child's group has exited (or time.monotonic() passes
    `deadline`); True if the group is gone.

    The whole group, not just its leader: helpers that clean up after the leader must be allowed
    to finish. Python's resource tracker unlinks the shared memory a vLLM engine leaves behind
    once its clients are gone; a SIGKILL right after the leader's exit leaked 160 MB of /dev/shm
    per stopped policy server."""
    while True:
        process.poll()  # reap the leader: a zombie still counts as a member of its group
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the child's group, give it `grace_s` to exit whole, then SIGKILL what is left."""
    signal_group(process, signal.SIGTERM)
    wait_group(process, time.monotonic() + grace_s)
    signal_group(process, signal.SIGKILL)
    process.wait()


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit in the main thread, like Ctrl-C raises KeyboardInterrupt."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def run_async_until_signalled(coro, on_exit=None) -> None:
    """Run an asyncio main until it ends or SIGTERM/SIGINT arrives; always run the cleanup."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        loop.run_until_complete(task)
    except asyncio.CancelledError:
        log.info("stopping on signal")
    finally:
        if on_exit:
            on_exit()
        loop.close()


def run_role(
    argv: list[str] | None, role: str, build: Callable[[Any], Any], index: Callable[[Any], int] = lambda cfg: 0
) -> None:
    """The main of a synchronous role: config from `key=value` arguments, logging, metrics on the
    role's port, then `build(cfg).run()` until it returns or the process is told to stop.
    The built object has `.metrics` (a RoleMetrics) and `.run()`; `.close()` runs at exit if present."""
    from common.logs import setup_logging
    from pipeline.config import load_config

    cfg = load_config(sys.argv[1:] if argv is None else argv)
    i = index(cfg)
    setup_logging(f"{role}{i}" if role in ("env_actor", "policy_server") else role)
    exit_on_sigterm()
    process = build(cfg)
    process.metrics.serve(cfg.metrics.host, cfg.metrics.port(role, i))
    try:
        process.run()
    except (KeyboardInterrupt, SystemExit):
        log.info("%s stopping", role)
    finally:
        if hasattr(process, "close"):
            process.close()
