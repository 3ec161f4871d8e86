"""Random network distillation (Burda et al. 2018, arXiv 1810.12894): the alternative intrinsic
reward of the EMPO2 paper's Figure 11 (learner.intrinsic_kind=rnd).

For the state text s_{i,t} of each turn (Trajectory.observations):
    φ(s)         hashed bag of words and word bigrams, L2-normalised          [D]
    e(s)         ‖ f̂(φ(s)) − f(φ(s)) ‖²   f: fixed random MLP, f̂: trained predictor
    r_int(s)     coef · e(s) / σ_e         σ_e: running std of every e seen so far
A state met often is predicted well (small e), a novel one is not. The predictor trains on each
batch's states after their bonuses are computed (learner.rnd_updates Adam steps), so a batch
is rewarded for what was new before it. The paper uses RND in place of the memory count, so the
bonus applies to every mode (the count bonus only to tip modes).

The features cost no model: crc32 of each n-gram (deterministic across processes, unlike
Python's salted hash) indexes a [D] count vector. The state (both nets, the predictor's
optimizer, the running moments) is checkpointed (state_dict / load_state_dict).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from learner.config import LearnerConfig
from protocol.messages import Trajectory


def observation_features(texts: list[str], dim: int) -> torch.Tensor:
    """[N, dim] hashed, L2-normalised bag of lower-cased words and word bigrams."""
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for n, text in enumerate(texts):
        words = text.lower().split()
        for gram in words + [f"{a} {b}" for a, b in zip(words, words[1:])]:
            out[n, zlib.crc32(gram.encode()) % dim] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return torch.from_numpy(out / np.maximum(norms, 1e-12))


def _mlp(cfg: LearnerConfig) -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(cfg.rnd_feature_dim, cfg.rnd_hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(cfg.rnd_hidden, cfg.rnd_output_dim),
    )


class RNDBonus:
    """An IntrinsicReward (learner/advantages.py): episodes -> [turns] r_int, then one training round."""

    def __init__(self, cfg: LearnerConfig, seed: int):
        self.cfg = cfg
        with torch.random.fork_rng():  # the nets' initialisation leaves the training RNG untouched
            torch.manual_seed(seed)
            self.target = _mlp(cfg).requires_grad_(False)
            self.predictor = _mlp(cfg)
        self.optimizer = torch.optim.Adam(self.predictor.parameters(), lr=cfg.rnd_lr)
        self.count, self.mean, self.m2 = 0, 0.0, 0.0  # Welford moments of the prediction errors

    def errors(self, features: torch.Tensor) -> torch.Tensor:
        """[N] squared prediction error e(s) (with grad into the predictor)."""
        return (self.predictor(features) - self.target(features)).pow(2).sum(-1)

    def __call__(self, trajectories: list[Trajectory]) -> list[np.ndarray]:
        features = observation_features([o for t in trajectories for o in t.observations], self.cfg.rnd_feature_dim)
        with torch.no_grad():
            errors = self.errors(features).double().numpy()
        for e in errors:  # Welford: the running std includes this batch
            self.count += 1
            delta = e - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (e - self.mean)
        std = np.sqrt(self.m2 / self.count) if self.count > 1 and self.m2 > 0 else 1.0
        bonus = self.cfg.intrinsic_coef * errors / std
        for _ in range(self.cfg.rnd_updates):
            self.optimizer.zero_grad(set_to_none=True)
            self.errors(features).mean().backward()
            self.optimizer.step()
        return np.split(bonus, np.cumsum([t.num_turns for t in trajectories])[:-1])

    def state_dict(self) -> dict:
        return {
            "target": self.target.state_dict(),
            "predictor": self.predictor.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "moments": (self.count, float(self.mean), float(self.m2)),
        }

    def load_state_dict(self, state: dict) -> None:
        self.target.load_state_dict(state["target"])
        self.predictor.load_state_dict(state["predictor"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.count, self.mean, self.m2 = state["moments"]
