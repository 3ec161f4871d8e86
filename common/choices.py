"""Choice-valued config fields: string enums that OmegaConf validates at load.

OmegaConf matches an Enum field's value against the members' *names*, so every member is named
as its value (`plain = "plain"`). The str mixin keeps the members plain strings everywhere
else: `cfg.ratio == "decoupled"` holds, str() and f-strings give the value, and msgpack and
json write them as ordinary strings (Python 3.10 has no enum.StrEnum, hence this base).
"""

from __future__ import annotations

from enum import Enum


class Choice(str, Enum):
    """Base of every choice field's enum; members are named as their (lower-case) values."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Device(Choice):
    """Where a role computes (learner.device, policy_server.device)."""

    auto = "auto"  # CUDA if a GPU is visible, else CPU
    cpu = "cpu"
    cuda = "cuda"  # fails at start-up (in the role, not at config load) when no GPU is visible
