"""The learning-rate schedule (learner/optim.py): factors by hand, and the LR the steps use."""

from __future__ import annotations

import math

import pytest
import torch

from learner.config import LearnerConfig
from learner.optim import build_optimizer, lr_factor


def test_constant_is_one_after_warmup():
    assert [lr_factor(k, "constant", 2, 10) for k in range(4)] == [0.5, 1.0, 1.0, 1.0]


def test_linear_decays_from_one_without_reaching_zero():
    # warm-up 1: k=0 -> 1/1; then u = (k - 1) / (5 - 1): 0, 0.25, 0.5, 0.75 -> 1, 0.75, 0.5, 0.25
    assert [lr_factor(k, "linear", 1, 5) for k in range(5)] == pytest.approx([1.0, 1.0, 0.75, 0.5, 0.25])


def test_cosine_by_hand():
    # no warm-up, total 4: u = k / 4 -> (1 + cos(πu)) / 2
    expected = [1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 + math.cos(3 * math.pi / 4)) / 2]
    assert [lr_factor(k, "cosine", 0, 4) for k in range(4)] == pytest.approx(expected)


def test_scheduler_sets_the_optimizer_lr_per_step():
    cfg = LearnerConfig(lr=0.1, lr_schedule="linear", warmup_steps=2, total_steps=4)
    optimizer, scheduler = build_optimizer([torch.nn.Parameter(torch.zeros(1))], cfg)
    seen = []
    for _ in range(4):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # warm-up 0.05, 0.1; then u = 0, 0.5 -> 0.1, 0.05
    assert seen == pytest.approx([0.05, 0.1, 0.1, 0.05])
