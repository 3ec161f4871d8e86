"""Learner: batches of complete GRPO groups -> EMPO2 update -> new weights to every policy server.

The loop (Learner.run) reads top to bottom:
    get batch -> build turn samples -> optimizer step -> version += 1 -> push weights
              -> maybe checkpoint -> publish metrics
Sockets (DEALER clients): replay buffer (BatchRequest -> Batch | Wait), each policy server
(WeightChunk -> WeightUpdateAck).

Run: `empo2-learner [key=value ...]`.
"""

from __future__ import annotations

import copy
import json
from collections import defaultdict
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import zmq

from common.config import PipelineConfig
from common.metrics import LearnerMetrics
from common.model_prep import resolve_model
from common.process import run_role
from learner.advantages import CountBonus, IntrinsicReward
from learner.checkpoint import list_checkpoints, load_trainer_state, save_checkpoint
from learner.config import LearnerConfig
from learner.loss import ClipConfig, clipped_policy_loss, entropy, kl_k3, low_probability_mask
from learner.optim import build_optimizer
from learner.policy_model import batch_log_softmax, load_policy, token_logprobs
from learner.rnd import RNDBonus
from learner.samples import GiGPO, TurnSample, build_samples
from learner.weight_push import WeightPusher, weight_tensors
from protocol import Client
from protocol.messages import ON_POLICY_TIPS, Batch, BatchRequest, Trajectory, Wait
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


def score_without_grad(model, pairs: list[tuple[np.ndarray, np.ndarray]], budget: int) -> list[torch.Tensor]:
    """[T_j] log-probs of each (prompt, response) pair under `model`, in micro-batches, no graph."""
    device = next(model.parameters()).device
    out: list[torch.Tensor] = [torch.empty(0)] * len(pairs)
    with torch.no_grad():
        for mb in micro_batches([len(p) + len(r) for p, r in pairs], budget):
            prompts = [_ids(pairs[j][0], device) for j in mb]
            responses = [_ids(pairs[j][1], device) for j in mb]
            logp = token_logprobs(batch_log_softmax(model, prompts, responses), torch.cat(responses))
            for j, lp in zip(mb, logp.split([r.numel() for r in responses])):
                out[j] = lp
    return out


def _ids(tokens: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(tokens.astype(np.int64)).to(device)


def train_step(model, optimizer, samples: list[TurnSample], cfg: LearnerConfig, version: int, ref_model=None,
               scheduler=None) -> StepStats:
    """One optimizer step over all samples: the token mean of the EMPO2 loss.

    Samples are scored in micro-batches of at most cfg.micro_batch_tokens padded tokens, sorted
    by length. Each micro-batch's loss *sum* is back-propagated; the gradients are divided by the
    number of kept tokens at the end, which is exactly the token mean without knowing the
    low-probability mask in advance (it is decided per sample after its forward).
    """
    clip = ClipConfig(cfg.clip_low, cfg.clip_high, cfg.dual_clip)
    device = next(model.parameters()).device
    model.train()
    optimizer.zero_grad(set_to_none=True)
    # samples scored with tips: the mask needs their tip-free log-probs (the others' come with the update pass)
    tip_scored = [i for i, s in enumerate(samples) if s.with_tips and s.mode == ON_POLICY_TIPS]
    tipfree = score_without_grad(model, [(samples[i].tipfree_prompt, samples[i].response) for i in tip_scored], cfg.micro_batch_tokens)
    tipfree_min = {i: float(lp.min()) for i, lp in zip(tip_scored, tipfree)}
    ref_logp = score_without_grad(ref_model, [(s.update_prompt, s.response) for s in samples], cfg.micro_batch_tokens) if ref_model else None
    loss_sum, kept_tokens, masked = 0.0, 0, 0
    diags: dict[str, list[torch.Tensor]] = defaultdict(list)
    mismatch: list[torch.Tensor] = []
    for mb in micro_batches([len(s.update_prompt) + len(s.response) for s in samples], cfg.micro_batch_tokens):
        batch = [samples[i] for i in mb]
        responses = [_ids(s.response, device) for s in batch]
        lengths = torch.tensor([r.numel() for r in responses], device=device)
        log_softmax = batch_log_softmax(model, [_ids(s.update_prompt, device) for s in batch], responses)  # [ΣT, V]
        logp = token_logprobs(log_softmax, torch.cat(responses))  # [ΣT]
        behaviour = torch.from_numpy(np.concatenate([s.behaviour_logp for s in batch])).to(device)  # [ΣT]
        kept = []
        for i, s, lp, b in zip(mb, batch, logp.detach().split(lengths.tolist()), behaviour.split(lengths.tolist())):
            if s.policy_version == version and s.update_is_behaviour_prompt:
                mismatch.append((lp - b).abs())
            kept.append(low_probability_mask(tipfree_min[i] if i in tipfree_min else float(lp.min()), s.with_tips, cfg.low_prob_threshold))
        masked += kept.count(False)
        keep = torch.repeat_interleave(torch.tensor(kept, device=device), lengths)  # [ΣT] tokens of kept samples
        advantages = torch.repeat_interleave(torch.tensor([s.advantage for s in batch], dtype=torch.float32, device=device), lengths)
        logp, behaviour, advantages = logp[keep], behaviour[keep], advantages[keep]
        # one optimizer step per batch: the proximal policy is the current weights, detached
        proximal = logp.detach() if cfg.ratio == "decoupled" else None
        pg_loss, diag = clipped_policy_loss(logp, behaviour, advantages, clip, proximal, cfg.behaviour_weight_cap)
        loss = pg_loss
        if cfg.entropy_coef:
            diag["entropy"] = entropy(log_softmax[keep])
            loss = loss - cfg.entropy_coef * diag["entropy"]
        if ref_logp is not None:
            diag["kl"] = kl_k3(logp, torch.cat([ref_logp[i] for i in mb])[keep])
            loss = loss + cfg.kl_coef * diag["kl"]
        loss.sum().backward()
        loss_sum += float(loss.detach().sum())
        kept_tokens += logp.numel()
        for name, value in diag.items():
            diags[name].append(value.detach().float())
    if kept_tokens:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(kept_tokens)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
    lr = optimizer.param_groups[0]["lr"]
    if scheduler is not None:  # one schedule step per policy version, even when every sample was masked
        scheduler.step()
    def cat(xs: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(xs) if xs else torch.zeros(0)
        return x if x.numel() else torch.zeros(1)

    ratio, mism = cat(diags["ratio"]), cat(mismatch)
    return StepStats(
        loss=loss_sum / max(kept_tokens, 1), samples=len(samples), samples_masked=masked, tokens=kept_tokens,
        ratio_mean=float(ratio.mean()), ratio_max=float(ratio.max()),
        clip_fraction=float(cat(diags["clipped"]).mean()), dual_clip_fraction=float(cat(diags["dual_clipped"]).mean()),
        approx_kl=float(cat(diags["approx_kl"]).mean()),
        behaviour_weight_mean=float(cat(diags["behaviour_weight"]).mean()),
        behaviour_weight_capped_fraction=float(cat(diags["behaviour_weight_capped"]).mean()),
        entropy_mean=float(cat(diags["entropy"]).mean()), kl_mean=float(cat(diags["kl"]).mean()), lr=lr,
        advantage_abs_mean=float(np.mean([abs(s.advantage) for s in samples])) if samples else 0.0,
        logprob_mismatch_mean_nats=float(mism.mean()), logprob_mismatch_max_nats=float(mism.max()),
        mismatch_tokens=sum(m.numel() for m in mismatch),
    )


class Learner:
    def __init__(self, cfg: PipelineConfig):
        self.cfg, self.lcfg = cfg, cfg.learner
        self.metrics = LearnerMetrics()
        if self.lcfg.torch_threads:
            torch.set_num_threads(self.lcfg.torch_threads)
        torch.manual_seed(cfg.seed)
        self.checkpoints = Path(cfg.run_dir) / "checkpoints"
        resume_from = list_checkpoints(self.checkpoints)[-1:] if self.lcfg.resume else []
        self.model_path = str(resume_from[0]) if resume_from else resolve_model(cfg.model.name, cfg.model.cache_dir or None)
        self.model, self.tokenizer = load_policy(self.model_path)
        self.optimizer, self.scheduler = build_optimizer(self.model.parameters(), self.lcfg)
        if self.lcfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        # the KL reference is the policy the learner starts from (frozen)
        self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False) if self.lcfg.kl_coef else None
        if self.lcfg.intrinsic_kind not in ("count", "rnd"):
            raise ValueError(f"learner.intrinsic_kind must be count|rnd, got {self.lcfg.intrinsic_kind!r}")
        rnd = RNDBonus(self.lcfg, cfg.seed) if self.lcfg.intrinsic_kind == "rnd" else None
        self.intrinsic: IntrinsicReward = rnd or CountBonus(self.lcfg.intrinsic_coef)
        # what a checkpoint holds besides the weights, by name
        self.stateful = {"optimizer": self.optimizer, "scheduler": self.scheduler, **({"rnd": rnd} if rnd else {})}
        self.version = load_trainer_state(resume_from[0], self.stateful) if resume_from else 0  # +1 per step
        if resume_from:
            log.info("resumed from %s at policy version %d", resume_from[0], self.version)
        ctx = zmq.Context.instance()
        self.buffer = Client(ctx, cfg.endpoints.replay_buffer, timeout_s=60.0)
        self.policies = [Client(ctx, ep, timeout_s=self.lcfg.push_timeout_s) for ep in cfg.endpoints.policy_servers]
        self.pusher = WeightPusher(self.lcfg, self.policies, cfg.policy_server.tensor_parallel_size)
        if self.lcfg.ratio not in ("plain", "decoupled"):
            raise ValueError(f"learner.ratio must be plain|decoupled, got {self.lcfg.ratio!r}")
        if self.lcfg.advantage not in ("grpo", "gigpo"):
            raise ValueError(f"learner.advantage must be grpo|gigpo, got {self.lcfg.advantage!r}")
        lc = self.lcfg
        self.gigpo = GiGPO(lc.gigpo_gamma, lc.gigpo_step_weight, lc.gigpo_step_norm) if lc.advantage == "gigpo" else None
        self.history: list[dict] = []

    def run(self) -> dict:
        for client in [self.buffer, *self.policies]:
            wait_until_ready(client, "learner", self.cfg.env_actor.startup_timeout_s,
                             on_wait=lambda left, ep=client.endpoint: log.info("waiting for %s (%.0fs left)", ep, left))
        if self.version > 0:  # resumed: the servers start from the base model, give them ours
            self.push()
        log.info("learner ready at policy version %d; training up to step %d", self.version, self.lcfg.total_steps)
        while self.version < self.lcfg.total_steps:
            batch = self.next_batch()
            t0 = time.perf_counter()
            samples = build_samples(batch.trajectories, self.lcfg.score_scale, self.intrinsic, self.lcfg.adv_eps, self.gigpo)
            stats = train_step(self.model, self.optimizer, samples, self.lcfg, self.version, self.ref_model, self.scheduler)
            self.version += 1
            step_s = time.perf_counter() - t0
            push_s = self.push()
            if self.lcfg.checkpoint_every and self.version % self.lcfg.checkpoint_every == 0 and self.lcfg.weight_sync != "checkpoint":
                self.save_checkpoint()
            self.publish(batch.trajectories, stats, step_s, push_s)
        return self.finish()

    def push(self) -> float:
        """Bring every policy server to the current weights (learner.weight_sync); wall seconds."""
        if self.lcfg.weight_sync == "checkpoint":  # every push is a checkpoint the servers load
            return self.pusher.push_checkpoint(Path(self.save_checkpoint()), self.version)
        return self.pusher.push(weight_tensors(self.model), self.version)

    def next_batch(self) -> Batch:
        request = BatchRequest(learner_version=self.version, num_groups=self.lcfg.groups_per_step, max_staleness=self.lcfg.max_staleness)
        while True:
            reply = self.buffer.call(request)
            if isinstance(reply, Batch):
                return reply
            assert isinstance(reply, Wait)
            time.sleep(reply.retry_after_s)

    def publish(self, trajectories: list[Trajectory], stats: StepStats, step_s: float, push_s: float) -> None:
        m = self.metrics
        m.steps.inc()
        m.samples.inc(stats.samples)
        m.tokens.inc(stats.tokens)
        m.loss.set(stats.loss)
        m.step_seconds.observe(step_s)
        m.push_seconds.observe(push_s)
        m.policy_version.set(self.version)
        staleness = [self.version - 1 - v for t in trajectories for v in t.policy_versions.tolist()]
        record = {
            "step": self.version, "policy_version": self.version, "episodes": len(trajectories),
            "episode_score_mean": float(np.mean([t.score for t in trajectories])),
            "modes": sorted({t.mode for t in trajectories}), "staleness_mean_versions": float(np.mean(staleness)),
            "masked_fraction": stats.samples_masked / max(stats.samples, 1), "step_seconds": step_s, "weight_push_seconds": push_s,
            **{k: v for k, v in vars(stats).items()},
        }
        for name, gauge in m.stats.items():
            if name in record:
                gauge.set(record[name])
        self.history.append(record)
        log.info("step %d: loss=%.4f samples=%d (masked %d) tokens=%d score=%.1f ratio=%.3f clip=%.3f "
                 "mismatch=%.2e/%.2e nats lr=%.2e step=%.1fs push=%.1fs", self.version, stats.loss, stats.samples,
                 stats.samples_masked, stats.tokens, record["episode_score_mean"], stats.ratio_mean,
                 stats.clip_fraction, stats.logprob_mismatch_mean_nats, stats.logprob_mismatch_max_nats, stats.lr, step_s, push_s)

    def save_checkpoint(self) -> str:
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        return str(save_checkpoint(self.checkpoints, self.version, self.model, self.tokenizer, self.stateful, self.lcfg.keep_checkpoints))

    def finish(self) -> dict:
        summary = {"steps": self.version, "policy_version": self.version, "final_checkpoint": self.save_checkpoint(), "history": self.history}
        self.cfg.run_path("learner_summary.json").write_text(json.dumps(summary, indent=1))
        log.info("done: %d steps, policy version %d, checkpoint %s", self.version, self.version, summary["final_checkpoint"])
        return summary


def main(argv: list[str] | None = None) -> None:
    run_role(argv, "learner", Learner)


if __name__ == "__main__":
    main()
