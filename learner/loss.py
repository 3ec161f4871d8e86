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

empo2_loss assembles the terms for one micro-batch (LossInputs: its response tokens end to end), in this
order: the masks (the low-probability mask's verdict, the sampled tokens), π_old, the rollout correction's
weight, the clipped surrogate against the anchor the ratio mode picks (decoupled PPO's weight inside),
× the correction's weight, HeRL's loss on hindsight tokens (hindsight_policy_loss), − β_H · H_t, + β_KL · KL_t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from learner.config import LearnerConfig


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


@dataclass
class LossInputs:
    """What the objective reads of one micro-batch, per response token: [T] is every turn sample's response,
    end to end in the micro-batch's order; `keep` picks the N tokens in the loss."""

    logp: torch.Tensor  # [T] log πθ(a_t | s'), s' the prompt the sample's mode updates on (with grad)
    log_softmax: torch.Tensor  # [T, V] πθ at each response position (with grad): H_t
    behaviour_logp: torch.Tensor  # [T] log πθold(a_t | s, tips if shown): what the policy server sampled with
    # [T] log π_old, the learner's policy before the batch's first update (no grad): decoupled PPO's πprox, the
    # rollout correction's and HeRL's old policy; None: logp itself, detached (one step per batch: the same weights)
    proximal_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None  # [T] log πref of the KL reference (no grad); None without one
    advantages: torch.Tensor  # [T] float32: the A of each token's turn sample
    hindsight: torch.Tensor  # [T] bool: HeRL's hindsight tokens
    sample: torch.Tensor  # [T] long: each token's turn sample (mis judges samples)
    # [T] bool: the tokens in the loss: the sampled tokens (not SGE's glue) of the samples the low-probability
    # mask kept (its verdict is per sample: mask_subject, low_probability_mask)
    keep: torch.Tensor


def rollout_totals(
    old_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    weight: torch.Tensor,
    corrected: torch.Tensor,
    sample: torch.Tensor,
    judged: torch.Tensor,
) -> dict[str, float]:
    """A micro-batch's metrics of the rollout correction ([N] each, over the kept tokens; `judged`: all but
    HeRL's): KL(π_behaviour || π_old) by k3 on the sampled tokens (a_t ~ π_behaviour), |log ρ_t|'s maximum and
    quantiles, the weights and the tokens and samples corrected."""
    logratio = (old_logp - behaviour_logp)[judged].float()
    gap = logratio.abs()
    p50, p99 = torch.quantile(gap, torch.tensor([0.5, 0.99], device=gap.device)).tolist() if gap.numel() else (0, 0)
    return dict(
        rollout_tokens=int(gap.numel()),
        rollout_kl=float(kl_k3(behaviour_logp[judged].float(), old_logp[judged].float()).sum()),
        rollout_weight=float(weight[judged].sum()),
        rollout_corrected=float(corrected[judged].sum()),
        rollout_corrected_samples=int(sample[judged & corrected].unique().numel()),
        rollout_logratio_max=float(gap.max()) if gap.numel() else 0.0,
        rollout_logratio_p50=float(p50),
        rollout_logratio_p99=float(p99),
    )


def empo2_loss(
    inputs: LossInputs, cfg: LearnerConfig, hindsight_gamma: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """The EMPO2 loss L_t [N] of a micro-batch's kept tokens, to be summed and back-propagated (the token mean
    is the optimizer step's: it divides by the kept tokens of every rank's micro-batches of the mini-batch,
    which no micro-batch knows), and the micro-batch's metrics: sums over the kept tokens, and maxima, named
    as learner/step.py's StepTotals. `cfg`: the clip, the ratio mode, the rollout correction and the
    coefficients (learner.*); `hindsight_gamma`: herl.gamma, required when a token is HeRL's."""
    # the low-probability mask (Figure 6) and the response mask: every term below is over the N kept tokens
    keep = inputs.keep
    logp, behaviour_logp, advantages = inputs.logp[keep], inputs.behaviour_logp[keep], inputs.advantages[keep]
    hindsight, sample = inputs.hindsight[keep], inputs.sample[keep]
    # π_old, the weights before the batch's first update: decoupled PPO's πprox, the correction's, HeRL's
    old_logp = logp.detach() if inputs.proximal_logp is None else inputs.proximal_logp[keep]
    # rollout correction: w_t from ρ_t = π_old/π_behaviour (HeRL's hindsight tokens aside: ρ_t = 1), and the
    # ratio clipped against π_old (decoupled PPO's weight, the same ρ_t, is the correction's then)
    weight, corrected = rollout_correction(
        old_logp, torch.where(hindsight, old_logp, behaviour_logp), sample, cfg.rollout_correction,
        cfg.rollout_correction_cap, cfg.rollout_correction_low, cfg.rollout_correction_high,
    )  # fmt: skip
    anchor_logp = behaviour_logp if cfg.rollout_correction == "none" else old_logp
    # decoupled PPO: r_t against πprox = π_old, × w_t = πprox/πθold (capped)
    proximal_logp = old_logp if cfg.ratio == "decoupled" and cfg.rollout_correction == "none" else None
    clip = ClipConfig(cfg.clip_low, cfg.clip_high, cfg.dual_clip)
    # L_t = clipped surrogate (dual clip) [× w_t, decoupled] [× w_t, rollout correction] − β_H · H_t + β_KL · KL_t
    loss, diag = clipped_policy_loss(logp, anchor_logp, advantages, clip, proximal_logp, cfg.behaviour_weight_cap)
    loss = loss * weight
    # HeRL's hindsight tokens: −A·ρ/(ρ+γ), unclipped, ρ against π_old on the prompt they are trained on
    if bool(hindsight.any()):
        if hindsight_gamma is None:
            raise ValueError("hindsight samples in a batch, but no hindsight_gamma (herl.gamma) given")
        loss = torch.where(hindsight, hindsight_policy_loss(logp, old_logp, advantages, hindsight_gamma), loss)
    # − β_H · H_t and + β_KL · KL_t, on every kept token, hindsight ones too (both off in the paper)
    if cfg.entropy_coef:
        diag["entropy"] = entropy(inputs.log_softmax[keep])
        loss = loss - cfg.entropy_coef * diag["entropy"]
    else:  # measured all the same, without gradient (the paper's Figure 7): the same logits, no other pass
        diag["entropy"] = measured_entropy(inputs.log_softmax)[keep]
    if inputs.ref_logp is not None:
        diag["kl"] = kl_k3(logp, inputs.ref_logp[keep])
        loss = loss + cfg.kl_coef * diag["kl"]
    metrics = dict(
        loss=float(loss.detach().sum()),
        kept_tokens=logp.numel(),
        ratio_max=float(diag["ratio"].max()) if logp.numel() else 0.0,
        **rollout_totals(old_logp, behaviour_logp, weight, corrected, sample, ~hindsight),
        **{name: float(value.detach().float().sum()) for name, value in diag.items()},
    )
    return loss, metrics
