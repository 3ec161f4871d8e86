"""What a benchmark records about its own run, so a committed result reads the same on any machine."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def repo_relative(value: str | Path) -> str:
    """`value` with the repository's absolute path taken off (a path under it becomes relative to
    it; an argument such as `--out=/abs/repo/x` keeps its flag); anything else unchanged."""
    return str(value).replace(f"{REPO}/", "")


def command_line(invocation: list[str], args: list[str]) -> str:
    """The command that reruns a benchmark from the repository root, e.g.
    command_line([".venv/bin/python", "-m", "benchmarks.env_throughput"], sys.argv[1:])."""
    return " ".join([*invocation, *(repo_relative(a) for a in args)])


def run_header(invocation: list[str], args: list[str], **machine) -> dict:
    """What every result starts with: when (UTC), the command that reruns it (command_line) and the
    machine (cores, platform, Python, plus what the benchmark adds, e.g. its load averages)."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(invocation, args),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            **machine,
        },
    }


def write_result(out: str | Path, result: dict, indent: int = 2) -> None:
    """The result as JSON at `out` (its folder made if missing), and a line saying where."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=indent) + "\n")
    print(f"wrote {repo_relative(out)}")
