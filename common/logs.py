"""One log format for every process: time, process role, level, message (to stderr)."""

from __future__ import annotations

import logging
import os

# Log lines name an episode by the first characters of its uuid4 hex id: enough to tell a run's
# episodes apart and to grep for one, short enough to keep a line readable.
LOG_ID_CHARS = 8


def short_id(episode_id: str) -> str:
    return episode_id[:LOG_ID_CHARS]


def setup_logging(role: str) -> None:
    level = os.environ.get("EMPO2_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=level, format=f"%(asctime)s {role} %(levelname)s %(name)s: %(message)s", force=True)
