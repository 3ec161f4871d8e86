"""Rewards and GRPO advantages for per-turn samples.

Every turn of episode i gets the reward
    r_{i,t} = score_scale · score_i  +  r_int_{i,t}
where score_i is ScienceWorld's final score (every step shares it, docs/method.md) and r_int the
intrinsic reward of learner.intrinsic_kind. score_scale is 1 by default, as the reference: the
score stays on its 0..100 scale and r_int (at most coef) is added unscaled, so the novelty bonus
mostly breaks ties between equal scores.
    count  r_int_{i,t} = coef / (n_{i,t} + 1) in tip modes only (0 otherwise), with n_{i,t} the
           memories retrieved for that state (a novelty pseudo-count; CountBonus below); 0 on a
           turn whose retrieval failed (Trajectory.memory_retrieved 0: an outage is not novelty)
    rnd    r_int_{i,t} = coef · RND prediction error of the state, in every mode (learner/rnd.py)
The advantage normalises within the GRPO group (the G episodes of one
(task, variation)) over all of its turns:
    A_{i,t} = (r_{i,t} − mean_group r) / (std_group r + eps)
with std the sample standard deviation (Bessel's correction, n − 1, as torch.std and the
reference); a group of a single turn has std 0 (A = 0). No value network.

GiGPO (Feng et al. 2025, arXiv 2505.10978) adds a step-level advantage: steps whose state
(observation text) is identical across the group's episodes form an anchor group; their
discounted returns G_{i,t} = Σ_k γ^{k−t} r'_{i,k} (r' = score_scale · score_i at the last step,
plus r_int each step) are normalised within it, and
    A_{i,t} = A^{episode}_{i,t} + w · A^{step}_{i,t}
with std normalisation (Bessel-corrected as above) or mean-only ("mean"); a state seen once has
A^{step} = 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from protocol.messages import OFF_POLICY, ON_POLICY_TIPS, Trajectory

TIP_MODES = (ON_POLICY_TIPS, OFF_POLICY)


IntrinsicReward = Callable[[list[Trajectory]], list[np.ndarray]]  # episodes -> [turns] r_int of each


@dataclass
class CountBonus:
    """The paper's r_int = coef / (n + 1) in tip modes: n memories retrieved for the state. A turn
    whose retrieval failed (memory_retrieved 0: the memory service did not answer) gets 0, not the
    largest bonus that n = 0 would give."""

    coef: float

    def __call__(self, trajectories: list[Trajectory]) -> list[np.ndarray]:
        return [
            self.coef / (t.num_memories.astype(np.float64) + 1.0) * (t.memory_retrieved == 1)
            if t.mode in TIP_MODES
            else np.zeros(t.num_turns)
            for t in trajectories
        ]


def turn_rewards(traj: Trajectory, score_scale: float, intrinsic: np.ndarray) -> np.ndarray:
    """[turns] reward of each turn of one episode, given its [turns] intrinsic reward: its score plus
    HeRL's improvement bonus (Trajectory.score_bonus, 0 unless its revision was played), scaled."""
    return np.full(traj.num_turns, (traj.score + traj.score_bonus) * score_scale, dtype=np.float64) + intrinsic


def group_advantages(rewards: list[np.ndarray], eps: float) -> list[np.ndarray]:
    """GRPO: normalise each group member's turn rewards by the group's mean and std."""
    pooled = np.concatenate(rewards)
    mean, std = pooled.mean(), sample_std(pooled)
    return [(r - mean) / (std + eps) for r in rewards]


def sample_std(values: np.ndarray) -> float:
    """Standard deviation with Bessel's correction (ddof 1, as torch.std); 0 for fewer than 2 values."""
    return float(values.std(ddof=1)) if values.size > 1 else 0.0


def discounted_returns(traj: Trajectory, score_scale: float, intrinsic: np.ndarray, gamma: float) -> np.ndarray:
    """[turns] G_t with the episode score paid at the last step and r_int at every step."""
    rewards = np.array(intrinsic, dtype=np.float64)
    rewards[-1] += traj.score * score_scale
    returns = np.zeros_like(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


def anchor_step_advantages(
    members: list[Trajectory], returns: list[np.ndarray], norm: str, eps: float
) -> list[np.ndarray]:
    """GiGPO's step advantage: normalise returns within groups of identical states; `norm` is
    learner.gigpo_step_norm ("std", or "mean" for mean-only; validated at load)."""
    anchors: dict[str, list[tuple[int, int]]] = {}
    for i, traj in enumerate(members):
        for t, state in enumerate(traj.observations):
            anchors.setdefault(state, []).append((i, t))
    advantages = [np.zeros_like(r) for r in returns]
    for positions in anchors.values():
        if len(positions) < 2:
            continue
        values = np.array([returns[i][t] for i, t in positions])
        centred = values - values.mean()
        scaled = centred / (sample_std(values) + eps) if norm == "std" else centred
        for (i, t), a in zip(positions, scaled):
            advantages[i][t] = a
    return advantages


def improvement_bonus(score: float, guided_score: float, alpha: float) -> float:
    """HeRL's "potential for improvement": a revised candidate's reward moves by α (herl.alpha, 0.05)
    of the gap to its guided revision's score, up or down: r' = r + α (r_guided − r)."""
    return score + alpha * (guided_score - score)
