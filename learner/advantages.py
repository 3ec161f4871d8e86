"""Rewards and GRPO advantages for per-turn samples.

Every turn of episode i gets the reward
    r_{i,t} = score_scale · score_i  +  r_int_{i,t}
where score_i is ScienceWorld's final score (every step shares it, empo2.md) and, in tip modes
only, r_int_{i,t} = coef / (n_{i,t} + 1) with n_{i,t} the memories retrieved for that state
(a novelty pseudo-count). The advantage normalises within the GRPO group (the G episodes of one
(task, variation)) over all of its turns:
    A_{i,t} = (r_{i,t} − mean_group r) / (std_group r + eps)
No value network.
"""

from __future__ import annotations

import numpy as np

from protocol.messages import OFF_POLICY, ON_POLICY_TIPS, Trajectory

TIP_MODES = (ON_POLICY_TIPS, OFF_POLICY)


def turn_rewards(traj: Trajectory, score_scale: float, intrinsic_coef: float) -> np.ndarray:
    """[turns] reward of each turn of one episode."""
    extrinsic = np.full(traj.num_turns, traj.score * score_scale, dtype=np.float64)
    if traj.mode not in TIP_MODES:
        return extrinsic
    return extrinsic + intrinsic_coef / (traj.num_memories.astype(np.float64) + 1.0)


def group_advantages(rewards: list[np.ndarray], eps: float = 1e-6) -> list[np.ndarray]:
    """GRPO: normalise each group member's turn rewards by the group's mean and std."""
    pooled = np.concatenate(rewards)
    mean, std = pooled.mean(), pooled.std()
    return [(r - mean) / (std + eps) for r in rewards]
