"""Configuration of the learner, including the EMPO2 objective."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LearnerConfig:
    total_steps: int = 3  # optimizer steps; the policy version rises by one per step
    groups_per_step: int = 1  # complete GRPO groups per batch
    max_staleness: int = 4  # groups generated more than this many versions ago are dropped
    lr: float = 1e-6  # peak learning rate (AdamW)
    lr_schedule: str = (
        "constant"  # "constant" | "linear" | "cosine": decay from lr to 0 over total_steps, after warm-up
    )
    warmup_steps: int = 0  # steps of linear warm-up from lr / warmup_steps up to lr
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_low: float = 0.2  # ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.3
    dual_clip: float = 10.0  # for negative advantages the loss is bounded by dual_clip * |A|
    ratio: str = "plain"  # "plain": r = πθ/πbehaviour (paper) | "decoupled": decoupled PPO for stale samples
    behaviour_weight_cap: float = 5.0  # decoupled: tokens with πprox/πbehaviour above this are dropped
    entropy_coef: float = 0.0  # β_H: entropy bonus (off in the paper)
    kl_coef: float = 0.0  # β_KL: k3 KL to the initial policy, kept frozen in memory (off in the paper)
    device: str = (
        "auto"  # "auto" (CUDA if visible) | "cpu" | "cuda" (fails at start without a GPU); one device per torchrun rank
    )
    micro_batch_tokens: int = (
        4096  # padded tokens per forward pass: samples sorted by length, batched up to this; 1 = one at a time
    )
    lora_rank: int = (
        0  # r of LoRA adapters (peft) on lora_targets; 0 = full fine-tuning. Only adapters train and are pushed
    )
    lora_alpha: float = 16.0  # LoRA scale = alpha / r
    lora_targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )  # module names adapted
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, more time
    low_prob_threshold: float = -5.0  # drop a tip-rollout turn whose min tip-free log-prob is below
    intrinsic_kind: str = "count"  # "count": r_int = coef / (n + 1), n memories retrieved, tip modes only (paper)
    #                                 "rnd": r_int = coef * RND error / running std, every mode (Figure 11's alternative; learner/rnd.py)
    intrinsic_coef: float = 1.0  # coef of r_int, either kind; 0 = no intrinsic reward
    rnd_feature_dim: int = 1024  # rnd: size of the hashed bag-of-words/bigrams vector of an observation
    rnd_hidden: int = 256  # rnd: hidden width of the target and predictor MLPs
    rnd_output_dim: int = 64  # rnd: embedding size the predictor regresses
    rnd_lr: float = 1e-3  # rnd: Adam learning rate of the predictor
    rnd_updates: int = 1  # rnd: predictor steps on each batch's observations, after its bonuses
    score_scale: float = 0.01  # ScienceWorld scores (0..100) are scaled to 0..1 before adding r_int
    adv_eps: float = 1e-6
    advantage: str = "grpo"  # "grpo" (episode level) | "gigpo" (episode + anchor-state step level)
    gigpo_gamma: float = 0.95  # discount of the step-level returns
    gigpo_step_weight: float = 1.0  # w in A = A_episode + w * A_step
    gigpo_step_norm: str = "std"  # "std" | "mean" (mean-only) normalisation within an anchor group
    checkpoint_every: int = 0  # 0 = only at the end
    keep_checkpoints: int = 3  # retention: the newest N complete checkpoints are kept
    resume: bool = True  # start from the newest checkpoint in run_dir/checkpoints, if any
    weight_sync: str = (
        "zmq"  # how servers get new weights: "zmq" frames (any host) | "shm" a file in weight_dir (one host)
    )
    #                           | "checkpoint" the HF checkpoint written at each push (shared filesystem) | "nccl" (GPU hosts)
    weight_dir: str = "/dev/shm"  # "shm" sync: where the weight file is written (shared memory)
    nccl_address: str = "127.0.0.1"  # "nccl" sync: the learner's rendezvous address, reachable by the servers
    nccl_port: int = 29600  # "nccl" sync: rendezvous port of the first server's group (+i for server i)
    weight_chunk_bytes: int = 64 << 20  # "zmq" sync: weight push message size
    push_timeout_s: float = 300.0
    batch_poll_s: float = 2.0  # wait between batch requests while groups are incomplete
    torch_threads: int = 0  # 0 = torch default
