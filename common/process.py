"""Process plumbing shared by every role: signals become clean exits, so `finally` blocks run
(closing ScienceWorld's JVMs, flushing stores) when the launcher or systemd stops a process."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

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
