"""LoRA maths shared by the learner (merged checkpoints) and the policy servers (adapter merge)."""

from __future__ import annotations

import torch


def lora_merged(weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float) -> torch.Tensor:
    """The weight a LoRA update stands for: W0 + scale * B @ A, computed in float32 and returned in
    W0's dtype. The learner's checkpoints and the servers' merges both use it."""
    return (weight.float() + scale * (lora_b.float() @ lora_a.float())).to(weight.dtype)
