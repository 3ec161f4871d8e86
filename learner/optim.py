"""The optimizer and its learning-rate schedule (learner.lr_schedule, learner.warmup_steps).

The schedule is a factor on learner.lr as a function of the steps already taken, k:
    warm-up  k < W:   (k + 1) / W                        (the first step already moves)
    then     u = (k − W) / (total_steps − W) in [0, 1)
             constant 1 | linear 1 − u | cosine (1 + cos πu) / 2
so no step is taken at a zero learning rate. Its state (the step count) is checkpointed with the
optimizer's (learner/checkpoint.py).
"""

from __future__ import annotations

import math

import torch

from learner.config import LearnerConfig


def lr_factor(step: int, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """`schedule` is learner.lr_schedule (constant | linear | cosine, validated at load)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    u = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    if schedule == "linear":
        return 1.0 - u
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * u))
    return 1.0


def build_optimizer(params, cfg: LearnerConfig) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg.lr_schedule, cfg.warmup_steps, cfg.total_steps)
    )
    return optimizer, scheduler
