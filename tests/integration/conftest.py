"""Fixtures that start real role processes and always stop them (process group kill)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.process import spawn_command, stop_group
from tests.helpers import REPO


class RoleProcess:
    def __init__(self, command: str, overrides: list[str], log_path: Path):
        self.log_path = log_path
        self.proc = spawn_command(command, overrides, log_path, cwd=REPO)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_group(self.proc, grace_s=20)  # the whole group: vLLM workers, JVMs, resource trackers


@pytest.fixture
def start_role(tmp_path):
    started: list[RoleProcess] = []

    def start(command: str, overrides: list[str], name: str) -> RoleProcess:
        role = RoleProcess(command, overrides, tmp_path / f"{name}.log")
        started.append(role)
        return role

    yield start
    for role in reversed(started):
        role.stop()
