"""Configuration of the learner, including the EMPO2 objective. Defaults are the paper's recipe
(docs/method.md); the small CPU run is conf/profile/cpu.yaml. How the new weights
reach the servers is the shared `weight_sync` section (pipeline/config.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.choices import Choice, Device
from common.config import at_least, check, gpu_list, positive, within


class LrSchedule(Choice):
    constant = "constant"
    linear = "linear"  # decay from lr to 0 over total_steps, after warm-up
    cosine = "cosine"


class Ratio(Choice):
    plain = "plain"  # r = πθ/πbehaviour (the paper)
    decoupled = "decoupled"  # decoupled PPO for stale samples (clip against πprox, weight πprox/πbehaviour)


class RolloutCorrection(Choice):
    """Off-policy correction of the behaviour policy's mismatch (learner/loss.py, rollout_correction):
    ρ_t = π_old(a_t)/π_behaviour(a_t), π_old the learner's policy before the update, π_behaviour the
    log-probs the policy server returned. Anything but none clips the ratio against π_old."""

    none = "none"  # no correction: the ratio as learner.ratio says (the paper)
    tis = "tis"  # truncated importance sampling: L_t × min(ρ_t, cap) (Yao et al. 2025, verl)
    mis = "mis"  # masked importance sampling: a turn sample leaves when Π_t ρ_t is outside [1/cap, cap]
    token_mask = "token_mask"  # IcePop: tokens with ρ_t outside [low, high] get no gradient


class LowProbMask(Choice):
    # every turn sample in every mode while memory is in use (replay_buffer.p_memory > 0), judged on
    # the prompt it is updated on (tip-free off-policy, with tips on-policy with tips): the paper's
    paper = "paper"
    tip_rollouts = "tip_rollouts"  # only samples rolled out with tips, judged on the tip-free prompt
    off = "off"


class Packing(Choice):
    """How the turn samples of a batch are laid out for the forward passes (learner/step.py); every
    one scores each turn's response on the same prompt, so the step is the same (up to float
    rounding), only its cost differs (benchmarks/learner_throughput.py)."""

    turn = "turn"  # one sequence per turn: its whole prompt again (an episode of T turns costs ~T prompts)
    episode = "episode"  # one sequence per chain of turns (Trajectory.chain_starts): each episode scored once
    # episode, and sequences with a common prefix (a group's system part and first turn) share it in one
    # row, as long as the row fits micro_batch_tokens: the linear layers see the prefix once, the
    # attention runs per sequence (split attention, learner/policy_model.py)
    group = "group"


class IntrinsicKind(Choice):
    count = "count"  # r_int = coef / (n + 1), n memories retrieved, tip modes only (the paper)
    rnd = "rnd"  # r_int = coef * RND error / running std, every mode (Figure 11's alternative; learner/rnd.py)


class Advantage(Choice):
    grpo = "grpo"  # episode level
    gigpo = "gigpo"  # episode + anchor-state step level


class GigpoStepNorm(Choice):
    std = "std"
    mean = "mean"  # mean-only normalisation within an anchor group


@dataclass
class LearnerConfig:
    total_steps: int = 3  # learner steps (batches); the policy version rises by one per step
    groups_per_step: int = 16  # complete GRPO groups per batch (the paper: 16 tasks x G = 8 episodes)
    max_staleness: int = 4  # groups generated more than this many versions ago are dropped
    lr: float = 1e-6  # peak learning rate (AdamW)
    lr_schedule: LrSchedule = LrSchedule.constant  # constant | linear | cosine, after warm-up
    warmup_steps: int = 0  # steps of linear warm-up from lr / warmup_steps up to lr
    weight_decay: float = 0.01  # AdamW's decoupled weight decay (the reference's 0.01)
    max_grad_norm: float = 1.0  # the gradient's global norm is clipped to this before each optimizer step
    clip_low: float = 0.2  # ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.3  # the upper clip: 1 + clip_high (the reference's asymmetric 0.2 / 0.3)
    dual_clip: float = 10.0  # for negative advantages the loss is bounded by dual_clip * |A|
    ratio: Ratio = Ratio.plain  # plain (paper) | decoupled (decoupled PPO for stale samples)
    behaviour_weight_cap: float = 5.0  # decoupled: tokens with πprox/πbehaviour above this are dropped
    # none | tis | mis | token_mask: the learner's policy before the update against the servers' behaviour
    # log-probs (RolloutCorrection); with one, the ratio is clipped against the former and the correction's
    # weight takes the place of decoupled PPO's (the same ρ = πprox/πbehaviour): plain and decoupled alike then
    rollout_correction: RolloutCorrection = RolloutCorrection.none
    rollout_correction_cap: float = 2.0  # C: tis truncates ρ_t at C; mis keeps a sample with Π_t ρ_t in [1/C, C]
    rollout_correction_low: float = 0.5  # token_mask: ρ_t below this is masked
    rollout_correction_high: float = 2.0  # token_mask: ρ_t above this is masked
    entropy_coef: float = 0.0  # β_H: entropy bonus (off in the paper)
    kl_coef: float = 0.0  # β_KL: k3 KL to the initial policy, kept frozen in memory (off in the paper)
    device: Device = Device.auto  # auto (CUDA if visible) | cpu | cuda; one device per torchrun rank
    gpus: list[int] = field(default_factory=list)  # its CUDA_VISIBLE_DEVICES ([4,5,6,7], every torchrun rank); [] = all
    # turn samples per optimizer step (the reference: 128 = 16 x 8): each batch is shuffled (seeded by the run's
    # seed and the policy version: reproducible, the same on every torchrun rank) and split into
    # ceil(samples / mini_batch_samples) near-equal mini-batches, one optimizer step each, so the clip engages
    # from the second on; 0 = the whole batch is one step. The learning-rate schedule still steps once per
    # batch (policy version), and the policy version rises by one per batch
    mini_batch_samples: int = 128
    update_epochs: int = 1  # passes over each batch, reshuffled per pass (the reference: 1)
    # padded tokens per forward pass: rows sorted by length, batched up to this; 1 = one at a time. The
    # learner's peak memory follows it (benchmarks/learner_throughput.py): lower it where memory is short
    micro_batch_tokens: int = 4096
    packing: Packing = Packing.group  # group | episode | turn: how turns are laid out in the forwards
    # r of LoRA adapters (peft) on lora_targets; 0 = full fine-tuning. Only adapters train and are pushed
    lora_rank: int = 0
    lora_alpha: float = 16.0  # LoRA scale = alpha / r
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])  # adapted
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, more time
    # gated MLPs and RMSNorms keep ~40% fewer activation bytes for the backward, the same gradients, no
    # matmul again (learner/lean_activations.py)
    lean_activations: bool = True
    # low-probability mask (paper Figure 6): a turn sample leaves the loss whole when the minimum log-prob of
    # its response is below low_prob_threshold; which samples, on which prompt: paper | tip_rollouts | off
    low_prob_mask: LowProbMask = LowProbMask.paper
    low_prob_threshold: float = -5.0  # the mask's bound on a response's minimum token log-prob (the paper's)
    intrinsic_kind: IntrinsicKind = IntrinsicKind.count  # count (paper) | rnd
    intrinsic_coef: float = 1.0  # coef of r_int, either kind; 0 = no intrinsic reward
    rnd_feature_dim: int = 1024  # rnd: size of the hashed bag-of-words/bigrams vector of an observation
    rnd_hidden: int = 256  # rnd: hidden width of the target and predictor MLPs
    rnd_output_dim: int = 64  # rnd: embedding size the predictor regresses
    rnd_lr: float = 1e-3  # rnd: Adam learning rate of the predictor
    rnd_updates: int = 1  # rnd: predictor steps on each batch's observations, after its bonuses
    # factor on the ScienceWorld score (0..100) before r_int is added; 1 = the reference: r_int (<= coef) breaks ties
    score_scale: float = 1.0
    adv_eps: float = 1e-6  # added to a group's score std before dividing (a group of equal scores: advantage 0)
    advantage: Advantage = Advantage.grpo  # grpo (episode level) | gigpo (episode + anchor-state step level)
    gigpo_gamma: float = 0.95  # discount of the step-level returns
    gigpo_step_weight: float = 1.0  # w in A = A_episode + w * A_step
    gigpo_step_norm: GigpoStepNorm = GigpoStepNorm.std  # std | mean (mean-only) within an anchor group
    checkpoint_every: int = 0  # also every N steps (0 = by time only, and at the end)
    # also after the first step this long after the last checkpoint (or the start): a crash repeats at most
    # this much work plus a step; 0 = off. Long runs checkpoint without being told; a short run writes only its final one
    checkpoint_every_s: float = 1800.0
    keep_checkpoints: int = 3  # retention: the newest N complete checkpoints (model dir and trainer state)
    resume: bool = True  # start from the newest checkpoint in run_dir/checkpoints, if any
    push_timeout_s: float = 300.0  # one weight push to one server, until it reports the version live
    push_attempts: int = 3  # a push that times out (a hung server) is sent again, this many tries in all
    # weight_sync.method=zmq with one learner process, asynchronous: each server gets the newest weights
    # from a thread of its own (a snapshot), the learner steps on; a hung server lags, never holds it
    # (learner/weight_push.py, BackgroundPushes). Otherwise, and when false, a push waits for every server.
    background_push: bool = True
    torch_threads: int = 0  # 0 = torch default

    def validate(self) -> None:
        at_least("groups_per_step", self.groups_per_step, 1)
        gpu_list("gpus", self.gpus, self.device)
        check(
            self.max_staleness >= 0,
            "max_staleness",
            f"a group is at least 0 versions old: >= 0, got {self.max_staleness}",
        )
        at_least("total_steps", self.total_steps, 0)
        positive("lr", self.lr)
        at_least("warmup_steps", self.warmup_steps, 0)
        check(
            0 <= self.clip_low < 1, "clip_low", f"the ratio is clipped at 1 - clip_low > 0: [0, 1), got {self.clip_low}"
        )
        at_least("clip_high", self.clip_high, 0)
        check(self.dual_clip > 1, "dual_clip", f"the dual-clip constant must be > 1, got {self.dual_clip}")
        positive("behaviour_weight_cap", self.behaviour_weight_cap)
        at_least("rollout_correction_cap", self.rollout_correction_cap, 1.0)
        low = self.rollout_correction_low
        check(0 < low <= 1, "rollout_correction_low", f"must be in (0, 1], got {low}")
        at_least("rollout_correction_high", self.rollout_correction_high, 1.0)
        at_least("micro_batch_tokens", self.micro_batch_tokens, 1)
        at_least("mini_batch_samples", self.mini_batch_samples, 0)
        at_least("update_epochs", self.update_epochs, 1)
        check(self.score_scale > 0, "score_scale", f"the score's factor must be > 0, got {self.score_scale}")
        at_least("lora_rank", self.lora_rank, 0)
        within("gigpo_gamma", self.gigpo_gamma, 0.0, 1.0)
        for name in ("rnd_feature_dim", "rnd_hidden", "rnd_output_dim"):
            at_least(name, getattr(self, name), 1)
        at_least("rnd_updates", self.rnd_updates, 0)
        at_least("checkpoint_every", self.checkpoint_every, 0)
        at_least("checkpoint_every_s", self.checkpoint_every_s, 0.0)
        at_least("keep_checkpoints", self.keep_checkpoints, 1)
        positive("push_timeout_s", self.push_timeout_s)
        at_least("push_attempts", self.push_attempts, 1)
        at_least("torch_threads", self.torch_threads, 0)
