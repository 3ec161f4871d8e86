"""The run's newest policy version, as a file in the run directory: the learner writes it after every
push that reached the servers (and at its start), a policy server (re)started into the run reads it
once, and serves no generation until a weight update reaches it (actors/policy_server/server.py).
So a restarted server never rolls the policy back to the base model, whatever weight_sync.method:
the learner notices the server is behind (its Pong) and pushes the newest weights to it alone
(learner/train.py, catch_up).

A server on another host whose run directory is not shared finds no file and serves from the start,
as before; the learner's catch-up still brings it to the newest version within seconds of a batch
wait. The file holds the version as decimal text; written to a temporary file and renamed, so a
reader sees the old value or the new one, never half of one.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

NEWEST_VERSION_FILE = "newest_policy_version"


def publish_newest_version(run_dir: str | Path, version: int) -> None:
    path = Path(run_dir) / NEWEST_VERSION_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(f"{version}\n")
    os.replace(tmp, path)


def read_newest_version(run_dir: str | Path) -> int:
    """The version the learner last published; 0 if none was (a new run, another host's run dir). A
    file that does not hold a version is reported and read as 0: the server then serves at once."""
    path = Path(run_dir) / NEWEST_VERSION_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return 0
    try:
        version = int(text.strip())
    except ValueError:
        version = -1
    if version < 0:
        log.warning("%s does not hold a policy version (%r): read as 0", path, text[:40])
        return 0
    return version
