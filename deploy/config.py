"""Configuration of the local launcher (deploy/launch.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LaunchConfig:
    num_env_actors: int = 2  # env actor processes (each one ScienceWorld JVM)
    progress_every_s: float = 15.0  # progress line interval
    timeout_s: float = 3600.0  # the whole bounded run; past it everything is stopped
    stop_grace_s: float = 20.0  # SIGTERM -> SIGKILL delay at shutdown
