"""The EMPO2 objective (Liu et al., "Exploratory Memory-Augmented LLM Agent via Hybrid On- and
Off-Policy Optimization", ICLR 2026, arXiv 2602.23008), per response token a_t of a turn sample.

Importance ratio (paper Table 3), with s the prompt and tips the retrieved memories:
    on-policy            log r_t = log πθ(a_t | s)        − log πθold(a_t | s)
    on-policy with tips  log r_t = log πθ(a_t | s, tips)  − log πθold(a_t | s, tips)
    off-policy           log r_t = log πθ(a_t | s)        − log πθold(a_t | s, tips)
πθold is the behaviour policy: the log-probs the policy server returned when it sampled a_t.
The caller scores the prompt that matches the mode (tips removed for off-policy, see samples.py);
this module only sees the two log-probs.

Clipped surrogate with asymmetric clip and dual clip (no KL, no entropy term by default; both
are options: L_t − β_H · H_t + β_KL · KL_t, with the k3 KL estimate against the initial policy;
H_t is measured at every step all the same, without gradient):
    L1_t = −A · r_t
    L2_t = −A · clip(r_t, 1 − ε_low, 1 + ε_high)
    L_t  = max(L1_t, L2_t)                  if A ≥ 0
         = min(max(L1_t, L2_t), −A · c)     if A < 0     (dual clip, c = 10)
Aggregated as a token mean over every unmasked response token of the mini-batch (one optimizer
step; learner.mini_batch_samples, learner/step.py).

Low-probability mask (paper Figure 6; learner.low_prob_mask): a turn sample is dropped whole
when the minimum log-prob of its response is below τ = −5. Which samples, judged on which prompt:
    paper         every sample in every mode while memory is in use (replay_buffer.p_memory > 0),
                  on the prompt it is updated on (plain, with tips, tip-free for off-policy): the
                  reference's first release
    tip_rollouts  only samples rolled out with tips, on the tip-free prompt (this pipeline's earlier
                  rule; on-policy-with-tips samples need a tip-free pass without grad)
    off           none

Staleness (the pipeline is asynchronous, so πθold may be k versions old): with
`proximal_logp` given, the decoupled PPO objective (AReaL, arXiv 2505.24298) replaces r_t by
    r_t = πθ(a_t|·) / πprox(a_t|·)        clipped as above
    L_t ← w_t · L_t,   w_t = πprox(a_t|·) / πθold(a_t|·)   (behaviour weight, no gradient)
where πprox is the learner's policy just before the update, and tokens with w_t above the cap
are dropped, so a stale or tip-shifted behaviour policy corrects the gradient without feeding an
unbounded ratio into the clip.

Rollout correction (learner.rollout_correction; verl's rollout correction, Yao et al. 2025, "Your
efficient RL framework secretly brings you off-policy RL training"; IcePop): the servers' log-probs
differ from the learner's on the same weights (another engine, another precision) and on stale ones.
With ρ_t = π_old(a_t|·) / π_behaviour(a_t|·), π_old the learner's policy before the update, the ratio
is clipped against π_old and the clipped surrogate weighted, without gradient (rollout_correction), in
place of decoupled PPO's w_t (the same ratio) under either learner.ratio:
    tis         L_t ← min(ρ_t, C) · L_t
    mis         L_t ← 1[1/C ≤ Π_{t∈i} ρ_t ≤ C] · L_t     (i: the token's turn sample, dropped whole)
    token_mask  L_t ← 1[low ≤ ρ_t ≤ high] · L_t
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class ClipConfig:
    """The clip constants, from learner.clip_low / clip_high / dual_clip (the paper: 0.2 / 0.3 / 10)."""

    clip_low: float  # ε_low
    clip_high: float  # ε_high
    dual_clip: float  # c


def clipped_policy_loss(
    logp: torch.Tensor,  # [N] log πθ of the response tokens (with grad)
    behaviour_logp: torch.Tensor,  # [N] log πθold from the policy server
    advantages: torch.Tensor,  # [N] the turn's advantage, repeated over its tokens
    clip: ClipConfig,
    proximal_logp: torch.Tensor | None = None,  # [N] log πprox (no grad): decoupled PPO if given
    behaviour_weight_cap: float | None = None,  # decoupled PPO: learner.behaviour_weight_cap (required then)
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss L_t [N] and per-token diagnostics (all detached but the loss)."""
    if proximal_logp is not None and behaviour_weight_cap is None:
        raise TypeError("decoupled PPO (proximal_logp given) needs behaviour_weight_cap")
    anchor_logp = behaviour_logp if proximal_logp is None else proximal_logp
    logratio = logp - anchor_logp
    ratio = torch.exp(logratio)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip.clip_low, 1.0 + clip.clip_high)
    pg_loss_clipped = torch.maximum(pg_loss1, pg_loss2)
    pg_loss3 = -advantages * clip.dual_clip
    pg_loss = torch.where(advantages < 0, torch.minimum(pg_loss_clipped, pg_loss3), pg_loss_clipped)
    behaviour_weight = torch.ones_like(ratio)
    if proximal_logp is not None:
        behaviour_weight = torch.exp(proximal_logp - behaviour_logp).detach()
        behaviour_weight = torch.where(
            behaviour_weight <= behaviour_weight_cap, behaviour_weight, torch.zeros_like(behaviour_weight)
        )
        pg_loss = pg_loss * behaviour_weight
    diagnostics = {
        "behaviour_weight": behaviour_weight,
        "behaviour_weight_capped": (behaviour_weight == 0).detach(),
        "ratio": ratio.detach(),
        "clipped": (pg_loss2 > pg_loss1).detach(),
        "dual_clipped": ((advantages < 0) & (pg_loss3 < pg_loss_clipped)).detach(),
        "approx_kl": ((ratio - 1) - logratio).detach(),  # k3 estimator of KL(πθold || πθ)
    }
    return pg_loss, diagnostics


def rollout_correction(
    old_logp: torch.Tensor,  # [N] log π_old: the learner's policy before the update (no grad)
    behaviour_logp: torch.Tensor,  # [N] log π_behaviour: what the policy server returned
    sample: torch.Tensor,  # [N] long: each token's turn sample (mis judges samples)
    mode: str,  # learner.rollout_correction: none | tis | mis | token_mask
    cap: float,  # C: learner.rollout_correction_cap
    low: float,  # token_mask: learner.rollout_correction_low
    high: float,  # token_mask: learner.rollout_correction_high
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight w_t [N] on L_t (no gradient) and the tokens it corrected [N] (bool), log ρ_t = log π_old − log π_b:
        none        w_t = 1
        tis         w_t = min(ρ_t, C)                              corrected: ρ_t > C (truncated)
        mis         w_t = 1[−log C ≤ Σ_{t∈i} log ρ_t ≤ log C]      corrected: every token of a dropped sample i
        token_mask  w_t = 1[low ≤ ρ_t ≤ high]                      corrected: w_t = 0
    mis judges the sequence's ratio, the product Π_t ρ_t over the sample's tokens (verl's sequence level), not
    the per-token geometric mean: a long response drifts further, and C bounds the whole sequence's weight."""
    logratio = (old_logp - behaviour_logp).detach()
    ratio = torch.exp(logratio)
    if mode == "tis":
        return torch.clamp(ratio, max=cap), ratio > cap
    if mode == "mis":
        sequence = torch.zeros(int(sample.max()) + 1 if sample.numel() else 0, device=logratio.device)
        sequence = sequence.index_add(0, sample, logratio.float())  # log Π_t ρ_t of each sample
        corrected = (sequence.abs() > math.log(cap))[sample]
    elif mode == "token_mask":
        corrected = (ratio < low) | (ratio > high)
    else:
        corrected = torch.zeros_like(ratio, dtype=torch.bool)
    return (~corrected).to(ratio.dtype), corrected


def entropy(log_softmax: torch.Tensor) -> torch.Tensor:
    """[T, V] log-probs -> [T] entropy of the policy at each response position."""
    return -(log_softmax.exp() * log_softmax).sum(-1)


@torch.no_grad()
def measured_entropy(log_softmax: torch.Tensor, rows: int = 256) -> torch.Tensor:
    """entropy() without gradient, `rows` positions at a time (a [rows, V] temporary at most): H_t of
    every step when it is not in the loss (the paper's Figure 7)."""
    return torch.cat([entropy(part) for part in log_softmax.detach().split(rows)])


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(πθ || πref) on sampled tokens: exp(Δ) − Δ − 1, Δ = ref − θ."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1


def mask_subject(rule: str, memory_in_use: bool, rolled_out_with_tips: bool) -> bool:
    """Whether the low-probability mask judges a turn sample: `rule` is learner.low_prob_mask
    (paper | tip_rollouts | off), `memory_in_use` replay_buffer.p_memory > 0."""
    if rule == "paper":
        return memory_in_use
    if rule == "tip_rollouts":
        return rolled_out_with_tips
    return False


def low_probability_mask(logp_min: float, subject: bool, threshold: float | None) -> bool:
    """True if the turn sample stays in the loss; `subject`: mask_subject's answer for it, `logp_min`
    its minimum response log-prob on the prompt the rule judges it on."""
    if threshold is None or not subject:
        return True
    return logp_min >= threshold


def hindsight_policy_loss(
    logp: torch.Tensor,  # [N] log πθ of hindsight (guided) tokens, with grad
    old_logp: torch.Tensor,  # [N] log πold recomputed on the prompt they are trained on (no grad)
    advantages: torch.Tensor,  # [N]
    gamma: float,  # herl.gamma: 1 (their instruction-following runs) or 0.1
) -> torch.Tensor:
    """HeRL's loss on hindsight tokens (sikelifei/HeRL): L_t = −A · w_t, w_t = ρ_t / (ρ_t + γ),
    ρ_t = πθ/πold, never clipped. Its gradient is −A · ργ/(ρ+γ)² · ∇log πθ: a quarter of an ordinary
    token's at ρ = 1, γ = 1, and it fades as ρ grows instead of being cut off."""
    ratio = torch.exp(logp - old_logp)
    return -advantages * ratio / (ratio + gamma)
