"""Learner: batches of complete GRPO groups -> EMPO2 update -> new weights to every policy server.

The loop (Learner.run) reads top to bottom:
    get batch -> build turn samples -> optimizer step -> version += 1 -> push weights
              -> maybe checkpoint -> publish metrics
Sockets (DEALER clients): replay buffer (BatchRequest -> Batch | Wait), each policy server
(WeightChunk -> WeightUpdateAck).

The model side (Trainer: policy, optimizer, schedule, step, checkpoints) is the same on every
rank of a torchrun job; rank 0 alone owns the sockets and broadcasts each batch
(learner/distributed.py). One process is the same code as a group of one.

Run: `empo2-learner [key=value ...]`
     `torchrun --nproc_per_node=N -m learner.train [key=value ...]` (N ranks, FSDP2; gloo on CPU,
     nccl on CUDA with learner.device=cuda; rank r serves metrics on the learner port + r).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import zmq

from common.metrics import LearnerMetrics
from common.model_prep import resolve_model
from common.process import run_role
from learner import distributed
from learner.advantages import CountBonus, IntrinsicReward
from learner.checkpoint import list_checkpoints, load_trainer_state, save_checkpoint
from learner.config import LearnerConfig
from learner.lora import apply_lora, is_lora, lora_scale, merged_weights
from learner.loss import ClipConfig, clipped_policy_loss, entropy, kl_k3, low_probability_mask
from learner.optim import build_optimizer
from learner.policy_model import ResponseScorer, batch_log_softmax, load_policy, token_logprobs
from learner.rnd import RNDBonus
from learner.samples import GiGPO, TurnSample, build_samples
from learner.weight_push import PushTiming, WeightPusher, weight_tensors
from pipeline.config import PipelineConfig
from protocol import Client
from protocol.messages import ON_POLICY, ON_POLICY_TIPS, Batch, BatchRequest, Trajectory, Wait
from protocol.transport import wait_until_ready

log = logging.getLogger("learner")


@dataclass
class StepStats:
    loss: float  # token-mean policy loss of the step
    samples: int
    samples_masked: int
    tokens: int
    ratio_mean: float
    ratio_max: float
    clip_fraction: float
    dual_clip_fraction: float
    approx_kl: float
    behaviour_weight_mean: float  # decoupled PPO: mean πprox/πbehaviour over kept tokens (1 when plain)
    behaviour_weight_capped_fraction: float  # decoupled PPO: tokens dropped over the cap
    entropy_mean: float  # mean policy entropy at response positions (0 unless entropy_coef)
    kl_mean: float  # mean k3 KL to the initial policy (0 unless kl_coef)
    lr: float  # learning rate of this step (learner.lr times the schedule's factor)
    advantage_abs_mean: float
    logprob_mismatch_mean_nats: float  # |vLLM - learner| on same-version, same-prompt tokens
    logprob_mismatch_max_nats: float
    mismatch_tokens: int


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Bucketing: sequence indices sorted by length and grouped so that each right-padded
    micro-batch holds at most `budget` tokens (its size times its longest length); a sequence
    longer than the budget goes alone, so budget 1 scores one sequence at a time."""
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if batches and (len(batches[-1]) + 1) * lengths[i] <= budget:  # sorted: i is the longest so far
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


# what a rank with no micro-batch left scores so that every rank runs the same forwards (FSDP);
# never in the loss
_PAD = TurnSample(
    np.zeros(1, np.int32),
    np.zeros(1, np.int32),
    np.zeros(1, np.int32),
    np.zeros(1, np.float32),
    0.0,
    ON_POLICY,
    -1,
    False,
)


def score_without_grad(model, pairs: list[tuple[np.ndarray, np.ndarray]], budget: int) -> list[torch.Tensor]:
    """[T_j] log-probs of each (prompt, response) pair under `model`, in micro-batches, no graph."""
    device = next(model.parameters()).device
    out: list[torch.Tensor] = [torch.empty(0)] * len(pairs)
    with torch.no_grad():
        for mb in distributed.synced(micro_batches([len(p) + len(r) for p, r in pairs], budget)):
            batch = [pairs[j] for j in mb] or [(_PAD.update_prompt, _PAD.response)]
            prompts, responses = [_ids(p, device) for p, _ in batch], [_ids(r, device) for _, r in batch]
            logp = token_logprobs(batch_log_softmax(model, prompts, responses), torch.cat(responses))
            for j, lp in zip(mb, logp.split([r.numel() for r in responses])):
                out[j] = lp
    return out


def _ids(tokens: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(tokens.astype(np.int64)).to(device)


_DIAGS = (
    "ratio",
    "clipped",
    "dual_clipped",
    "approx_kl",
    "behaviour_weight",
    "behaviour_weight_capped",
    "entropy",
    "kl",
)


def train_step(
    model, optimizer, samples: list[TurnSample], cfg: LearnerConfig, version: int, ref_model=None, scheduler=None
) -> StepStats:
    """One optimizer step over all samples: the token mean of the EMPO2 loss.

    Each rank takes every world_size-th sample by length (learner/distributed.py; all of them in
    a single process) and scores its share in micro-batches of at most cfg.micro_batch_tokens
    padded tokens, sorted by length. Each micro-batch's loss *sum* is back-propagated; the
    gradients, summed over ranks, are divided by the kept tokens of all ranks at the end, which
    is exactly the token mean without knowing the low-probability mask in advance (it is
    decided per sample after its forward).
    """
    clip = ClipConfig(cfg.clip_low, cfg.clip_high, cfg.dual_clip)
    device = next(model.parameters()).device
    distributed.init(device.type)  # a plain caller gets a group of one
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].update_prompt) + len(samples[i].response))
    mine = [samples[i] for i in order[distributed.rank() :: distributed.world_size()]]
    model.train()
    optimizer.zero_grad(set_to_none=True)
    # samples scored with tips: the mask needs their tip-free log-probs (the others' come with the update pass)
    tip_scored = [i for i, s in enumerate(mine) if s.with_tips and s.mode == ON_POLICY_TIPS]
    tipfree = score_without_grad(
        model, [(mine[i].tipfree_prompt, mine[i].response) for i in tip_scored], cfg.micro_batch_tokens
    )
    tipfree_min = {i: float(lp.min()) for i, lp in zip(tip_scored, tipfree)}
    ref_logp = (
        score_without_grad(ref_model, [(s.update_prompt, s.response) for s in mine], cfg.micro_batch_tokens)
        if ref_model
        else None
    )
    loss_sum, kept_tokens, masked, ratio_max = 0.0, 0, 0, 0.0
    diag_sums = dict.fromkeys(_DIAGS, 0.0)
    mismatch_sum, mismatch_tokens, mismatch_max = 0.0, 0, 0.0
    for mb in distributed.synced(
        micro_batches([len(s.update_prompt) + len(s.response) for s in mine], cfg.micro_batch_tokens)
    ):
        batch = [mine[i] for i in mb] or [_PAD]
        responses = [_ids(s.response, device) for s in batch]
        lengths = torch.tensor([r.numel() for r in responses], device=device)
        log_softmax = batch_log_softmax(model, [_ids(s.update_prompt, device) for s in batch], responses)  # [ΣT, V]
        logp = token_logprobs(log_softmax, torch.cat(responses))  # [ΣT]
        behaviour = torch.from_numpy(np.concatenate([s.behaviour_logp for s in batch])).to(device)  # [ΣT]
        kept = []
        for i, s, lp, b in zip(mb, batch, logp.detach().split(lengths.tolist()), behaviour.split(lengths.tolist())):
            if s.policy_version == version and s.update_is_behaviour_prompt:
                gap = (lp - b).abs()
                mismatch_sum, mismatch_tokens, mismatch_max = (
                    mismatch_sum + float(gap.sum()),
                    mismatch_tokens + gap.numel(),
                    max(mismatch_max, float(gap.max())),
                )
            kept.append(
                low_probability_mask(
                    tipfree_min[i] if i in tipfree_min else float(lp.min()), s.with_tips, cfg.low_prob_threshold
                )
            )
        masked += kept.count(False)
        keep = torch.repeat_interleave(
            torch.tensor(kept or [False], device=device), lengths
        )  # [ΣT] tokens of kept samples
        advantages = torch.repeat_interleave(
            torch.tensor([s.advantage for s in batch], dtype=torch.float32, device=device), lengths
        )
        logp, behaviour, advantages = logp[keep], behaviour[keep], advantages[keep]
        # one optimizer step per batch: the proximal policy is the current weights, detached
        proximal = logp.detach() if cfg.ratio == "decoupled" else None
        pg_loss, diag = clipped_policy_loss(logp, behaviour, advantages, clip, proximal, cfg.behaviour_weight_cap)
        loss = pg_loss
        if cfg.entropy_coef:
            diag["entropy"] = entropy(log_softmax[keep])
            loss = loss - cfg.entropy_coef * diag["entropy"]
        if ref_logp is not None:
            diag["kl"] = kl_k3(logp, torch.cat([ref_logp[i] for i in mb] or [torch.zeros(1, device=device)])[keep])
            loss = loss + cfg.kl_coef * diag["kl"]
        loss.sum().backward()  # also with nothing kept: every rank runs the same backwards (FSDP)
        loss_sum += float(loss.detach().sum())
        kept_tokens += logp.numel()
        for name, value in diag.items():
            diag_sums[name] += float(value.detach().float().sum())
        if logp.numel():
            ratio_max = max(ratio_max, float(diag["ratio"].max()))
    # every rank's share of the batch, summed
    loss_sum, kept_tokens, masked, mismatch_sum, mismatch_tokens, *diag_totals = distributed.all_reduce(
        [loss_sum, kept_tokens, masked, mismatch_sum, mismatch_tokens, *diag_sums.values()]
    )
    ratio_max, mismatch_max = distributed.all_reduce([ratio_max, mismatch_max], distributed.dist.ReduceOp.MAX)
    if kept_tokens:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(kept_tokens)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
    lr = optimizer.param_groups[0]["lr"]
    if scheduler is not None:  # one schedule step per policy version, even when every sample was masked
        scheduler.step()
    mean = {name: total / max(kept_tokens, 1) for name, total in zip(_DIAGS, diag_totals)}  # over kept tokens
    return StepStats(
        loss=loss_sum / max(kept_tokens, 1),
        samples=len(samples),
        samples_masked=int(masked),
        tokens=int(kept_tokens),
        ratio_mean=mean["ratio"],
        ratio_max=ratio_max,
        clip_fraction=mean["clipped"],
        dual_clip_fraction=mean["dual_clipped"],
        approx_kl=mean["approx_kl"],
        behaviour_weight_mean=mean["behaviour_weight"],
        behaviour_weight_capped_fraction=mean["behaviour_weight_capped"],
        entropy_mean=mean["entropy"],
        kl_mean=mean["kl"],
        lr=lr,
        advantage_abs_mean=float(np.mean([abs(s.advantage) for s in samples])) if samples else 0.0,
        logprob_mismatch_mean_nats=mismatch_sum / max(mismatch_tokens, 1),
        logprob_mismatch_max_nats=mismatch_max,
        mismatch_tokens=int(mismatch_tokens),
    )


class Trainer:
    """The learner's model side, the same on every rank (learner/distributed.py): the policy
    (sharded), its optimizer and learning-rate schedule, the frozen KL reference, the intrinsic
    reward and advantage options; one step per batch, full weights and checkpoints."""

    def __init__(self, cfg: LearnerConfig, model_path: str, seed: int, resume_from: Path | None = None):
        self.cfg = cfg
        for name, value, allowed in (
            ("ratio", cfg.ratio, ("plain", "decoupled")),
            ("advantage", cfg.advantage, ("grpo", "gigpo")),
            ("intrinsic_kind", cfg.intrinsic_kind, ("count", "rnd")),
        ):
            if value not in allowed:
                raise ValueError(f"learner.{name} must be {'|'.join(allowed)}, got {value!r}")
        self.device = distributed.init(cfg.device)
        self.model, self.tokenizer = load_policy(model_path, self.device)  # HF names, config, save_pretrained
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        # the KL reference is the policy the learner starts from (frozen)
        self.ref = self._sharded(copy.deepcopy(self.model).eval().requires_grad_(False)) if cfg.kl_coef else None
        if cfg.lora_rank:  # the base frozen, adapters trained and pushed (learner/lora.py)
            self.model = apply_lora(self.model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
        self.scorer = self._sharded(self.model)
        self.optimizer, self.scheduler = build_optimizer([p for p in self.scorer.parameters() if p.requires_grad], cfg)
        rnd = RNDBonus(cfg, seed) if cfg.intrinsic_kind == "rnd" else None
        self.intrinsic: IntrinsicReward = rnd or CountBonus(cfg.intrinsic_coef)
        self.gigpo = (
            GiGPO(cfg.gigpo_gamma, cfg.gigpo_step_weight, cfg.gigpo_step_norm) if cfg.advantage == "gigpo" else None
        )
        # what a checkpoint holds besides the weights, by name
        self.stateful = {
            "optimizer": distributed.FullOptimizerState(self.scorer, self.optimizer),
            "scheduler": self.scheduler,
            **({"rnd": rnd} if rnd else {}),
            **({"lora": distributed.FullTrainableState(self.scorer)} if cfg.lora_rank else {}),
        }
        self.version = load_trainer_state(resume_from, self.stateful) if resume_from else 0  # +1 per step

    @staticmethod
    def _sharded(lm) -> ResponseScorer:
        scorer = ResponseScorer(lm)
        distributed.shard(scorer, lm.get_decoder().layers)
        return scorer

    def step(self, trajectories: list[Trajectory]) -> StepStats:
        samples = build_samples(trajectories, self.cfg.score_scale, self.intrinsic, self.cfg.adv_eps, self.gigpo)
        stats = train_step(self.scorer, self.optimizer, samples, self.cfg, self.version, self.ref, self.scheduler)
        self.version += 1
        return stats

    def full_weights(self) -> dict[str, torch.Tensor]:
        """HF-named full weights on rank 0 ({} elsewhere); every rank must call it."""
        return distributed.full_weights(self.model)

    def save_checkpoint(self, root: Path, keep_last: int) -> Path | None:
        """Gathered on every rank, written by rank 0 (which gets the path)."""
        weights = self.full_weights()
        states = {name: obj.state_dict() for name, obj in self.stateful.items()}
        if distributed.rank() != 0:
            return None
        model = self.model
        if is_lora(model):  # the files hold the merged policy (servable); the adapter resumes from `states`
            weights, model = merged_weights(weights, lora_scale(model)), model.get_base_model()
        root.mkdir(parents=True, exist_ok=True)
        return save_checkpoint(root, self.version, model, self.tokenizer, states, keep_last, weights)


class Learner:
    def __init__(self, cfg: PipelineConfig):
        self.cfg, self.lcfg = cfg, cfg.learner
        self.metrics = LearnerMetrics()
        if self.lcfg.torch_threads:
            torch.set_num_threads(self.lcfg.torch_threads)
        torch.manual_seed(cfg.seed)
        self.checkpoints = Path(cfg.run_dir) / "checkpoints"
        resume_from = list_checkpoints(self.checkpoints)[-1:] if self.lcfg.resume else []
        # a LoRA run resumes from the base model plus the adapter in the trainer state, else from the checkpoint's weights
        self.model_path = (
            str(resume_from[0])
            if resume_from and not self.lcfg.lora_rank
            else resolve_model(cfg.model.name, cfg.model.cache_dir or None)
        )
        self.trainer = Trainer(self.lcfg, self.model_path, cfg.seed, resume_from[0] if resume_from else None)
        if resume_from:
            log.info("resumed from %s at policy version %d", resume_from[0], self.trainer.version)
        self.main = distributed.rank() == 0  # rank 0 alone talks to the buffer and the servers
        # (version, path) of the newest checkpoint on disk: a version is never written twice
        self.saved = (self.version, str(resume_from[0]) if self.main else "") if resume_from else (-1, "")
        self.history: list[dict] = []
        if not self.main:
            return
        ctx = zmq.Context.instance()
        self.buffer = Client(ctx, cfg.endpoints.replay_buffer, timeout_s=60.0)
        self.policies = [Client(ctx, ep, timeout_s=self.lcfg.push_timeout_s) for ep in cfg.endpoints.policy_servers]
        run_id = hashlib.sha1(str(Path(cfg.run_dir).resolve()).encode()).hexdigest()[:12]
        self.pusher = WeightPusher(
            self.lcfg, self.policies, cfg.policy_server.tensor_parallel_size, shm_name=f"run-{run_id}"
        )

    @property
    def version(self) -> int:
        return self.trainer.version

    def run(self) -> dict:
        for client in [self.buffer, *self.policies] if self.main else []:
            wait_until_ready(
                client,
                "learner",
                self.cfg.env_actor.startup_timeout_s,
                on_wait=lambda left, ep=client.endpoint: log.info("waiting for %s (%.0fs left)", ep, left),
            )
        if self.version > 0:  # resumed: the servers start from the base model, give them ours
            self.push()
        log.info("learner ready at policy version %d; training up to step %d", self.version, self.lcfg.total_steps)
        while self.version < self.lcfg.total_steps:
            batch = distributed.broadcast_message(self.next_batch() if self.main else None)
            t0 = time.perf_counter()
            stats = self.trainer.step(batch.trajectories)
            step_s = time.perf_counter() - t0
            push = self.push()
            if self.lcfg.checkpoint_every and self.version % self.lcfg.checkpoint_every == 0:
                self.save_checkpoint()
            if self.main:
                self.publish(batch.trajectories, stats, step_s, push)
        return self.finish()

    def push(self) -> PushTiming | None:
        """Bring every policy server to the current weights (learner.weight_sync). Every rank takes
        part in gathering them; rank 0 sends them and gets the timing (None elsewhere)."""
        if self.lcfg.weight_sync == "checkpoint":  # every push is a checkpoint the servers load
            path = self.save_checkpoint()
            return self.pusher.push_checkpoint(Path(path), self.version) if self.main else None
        weights = self.trainer.full_weights()
        if not self.main:
            return None
        model = self.trainer.model
        return self.pusher.push(
            weight_tensors(model, weights), self.version, lora_scale(model) if is_lora(model) else 0.0
        )

    def next_batch(self) -> Batch:
        request = BatchRequest(
            learner_version=self.version, num_groups=self.lcfg.groups_per_step, max_staleness=self.lcfg.max_staleness
        )
        while True:
            reply = self.buffer.call(request)
            if isinstance(reply, Batch):
                return reply
            assert isinstance(reply, Wait)
            time.sleep(reply.retry_after_s)

    def publish(self, trajectories: list[Trajectory], stats: StepStats, step_s: float, push: PushTiming) -> None:
        m = self.metrics
        m.steps.inc()
        m.samples.inc(stats.samples)
        m.tokens.inc(stats.tokens)
        m.loss.set(stats.loss)
        m.step_seconds.observe(step_s)
        m.push_seconds.observe(push.seconds)
        m.policy_version.set(self.version)
        staleness = [self.version - 1 - v for t in trajectories for v in t.policy_versions.tolist()]
        record = {
            "step": self.version,
            "policy_version": self.version,
            "episodes": len(trajectories),
            "episode_score_mean": float(np.mean([t.score for t in trajectories])),
            "modes": sorted({t.mode for t in trajectories}),
            "staleness_mean_versions": float(np.mean(staleness)),
            "masked_fraction": stats.samples_masked / max(stats.samples, 1),
            "step_seconds": step_s,
            "weight_push_seconds": push.seconds,
            "weight_push_engine_seconds": push.engine_seconds,
            **{k: v for k, v in vars(stats).items()},
        }
        for name, gauge in m.stats.items():
            if name in record:
                gauge.set(record[name])
        self.history.append(record)
        log.info(
            "step %d: loss=%.4f samples=%d (masked %d) tokens=%d score=%.1f ratio=%.3f clip=%.3f "
            "mismatch=%.2e/%.2e nats lr=%.2e step=%.1fs push=%.1fs",
            self.version,
            stats.loss,
            stats.samples,
            stats.samples_masked,
            stats.tokens,
            record["episode_score_mean"],
            stats.ratio_mean,
            stats.clip_fraction,
            stats.logprob_mismatch_mean_nats,
            stats.logprob_mismatch_max_nats,
            stats.lr,
            step_s,
            push.seconds,
        )

    def save_checkpoint(self) -> str:
        """Every rank takes part; rank 0 writes it and gets its path ("" elsewhere). A version
        already on disk (resumed from, or written by a weight_sync=checkpoint push) is not rewritten."""
        if self.saved[0] != self.version:
            path = self.trainer.save_checkpoint(self.checkpoints, self.lcfg.keep_checkpoints)
            self.saved = (self.version, str(path) if path else "")
        return self.saved[1]

    def finish(self) -> dict:
        summary = {
            "steps": self.version,
            "policy_version": self.version,
            "final_checkpoint": self.save_checkpoint(),
            "history": self.history,
        }
        if not self.main:
            return summary
        self.cfg.run_path("learner_summary.json").write_text(json.dumps(summary, indent=1))
        log.info(
            "done: %d steps, policy version %d, checkpoint %s", self.version, self.version, summary["final_checkpoint"]
        )
        return summary

    def close(self) -> None:
        if self.main:
            self.pusher.close()
        distributed.close()


def main(argv: list[str] | None = None) -> None:
    # under torchrun, rank r serves its metrics on the learner's port + r
    run_role(argv, "learner", Learner, index=lambda cfg: int(os.environ.get("RANK", 0)))


if __name__ == "__main__":
    main()
