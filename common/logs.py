"""One log format for every process: time, process role, level, message (to stderr)."""

from __future__ import annotations

import logging
import os


def setup_logging(role: str) -> None:
    level = os.environ.get("EMPO2_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s", force=True)
