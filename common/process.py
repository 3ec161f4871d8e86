"""Process plumbing shared by every role: signals become clean exits, so `finally` blocks run
(closing ScienceWorld's JVMs, flushing stores) when the launcher or systemd stops a process."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any, Callable

log = logging.getLogger(__name__)


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


def run_role(argv: list[str] | None, role: str, build: Callable[[Any], Any], index: Callable[[Any], int] = lambda cfg: 0) -> None:
    """The main of a synchronous role: config from `key=value` arguments, logging, metrics on the
    role's port, then `build(cfg).run()` until it returns or the process is told to stop.
    The built object has `.metrics` (a RoleMetrics) and `.run()`; `.close()` runs at exit if present."""
    from common.config import load_config
    from common.logs import setup_logging

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
