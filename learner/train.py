"""Learner: batches of complete GRPO groups -> EMPO2 update -> new weights to every policy server.

The loop (Learner.run) reads top to bottom:
    get batch -> build turn samples -> optimizer steps -> version += 1 -> push weights
              -> maybe checkpoint -> publish metrics
and the step itself is learner/step.py (train_step: score, then per mini-batch of
learner.mini_batch_samples: mask, loss, backward, optimizer step).
Each phase of both is timed (PHASES, PhaseTimer) and exported
(empo2_learner_phase_seconds{phase=...}): the paper's Figure 12 time breakdown.
Sockets (DEALER clients): replay buffer (BatchRequest -> Batch | Wait), each policy server
(WeightChunk -> WeightUpdateAck).

The model side (Trainer: policy, optimizer, schedule, step, checkpoints) is the same on every
rank of a torchrun job; rank 0 alone owns the sockets and broadcasts each batch
(learner/distributed.py). One process is the same code as a group of one.

Run: `empo2-learner [key=value ...]`
     `torchrun --nproc_per_node=N -m pipeline empo2-learner [key=value ...]` (N ranks, FSDP2; gloo on CPU,
     nccl on CUDA with learner.device=cuda; rank r serves metrics on the learner port + r).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
import zmq

from common.config import HerlConfig, RunFacts, TrainContext, WeightSyncConfig
from common.heartbeat import beat
from common.metrics import METRICS_LOG, LearnerMetrics
from common.model_prep import resolve_model
from common.process import release_free_heap, run_role, status_mb
from learner import distributed
from learner.advantages import CountBonus, IntrinsicReward
from learner.checkpoint import list_checkpoints, load_trainer_state, model_dir, save_checkpoint
from learner.config import LearnerConfig
from learner.exploration import exploration_stats
from learner.lean_activations import lean_activations
from learner.lora import apply_lora, is_lora, lora_scale, merged_weights
from learner.memory_use import memory_stats
from learner.optim import build_optimizer
from learner.policy_model import ResponseScorer, load_policy
from learner.rnd import RNDBonus
from learner.samples import GiGPO, build_samples, finite_samples
from learner.step import PHASES, PhaseTimer, StepContext, StepStats, train_step
from learner.weight_push import BackgroundPushes, PushTiming, WeightPusher, build_chunks, snapshot, weight_tensors
from protocol import Client, RemoteError, RequestTimeout
from protocol.messages import Batch, BatchConfirm, BatchRequest, Ping, Pong, Trajectory, Wait
from protocol.newest_version import publish_newest_version
from protocol.transport import wait_until_ready

log = logging.getLogger("learner")

# catch_up: how often the learner asks the servers' versions while it waits for a batch, and how long
# it waits for each answer (a hung server is left for the next time)
CATCH_UP_EVERY_S = 5.0
CATCH_UP_PING_S = 2.0


class Trainer:
    """The learner's model side, the same on every rank (learner/distributed.py): the policy
    (sharded), its optimizer and learning-rate schedule, the frozen KL reference, the intrinsic
    reward and advantage options; one step per batch, full weights and checkpoints."""

    def __init__(
        self,
        cfg: LearnerConfig,
        model_path: str,
        seed: int,
        resume_from: Path | None = None,
        memory_in_use: bool = True,
        reference_path: str | None = None,
        herl: HerlConfig | None = None,
    ):
        """`memory_in_use`: replay_buffer.p_memory > 0 (the paper's low-probability mask applies then).
        `reference_path`: the KL reference's weights, the policy the run started from (None: the
        weights at model_path; a resumed run passes its base model, not the checkpoint it loads)."""
        self.cfg = cfg  # its choices (ratio, advantage, intrinsic_kind, ...) were validated at load
        self.herl = herl if herl is not None and herl.enabled else None
        self.memory_in_use, self.seed = memory_in_use, seed
        self.device = distributed.init(cfg.device)
        # HF names, config, save_pretrained; from a checkpoint's model directory (either layout) or an HF directory
        self.model, self.tokenizer = load_policy(str(model_dir(model_path)), self.device)
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        # the KL reference is the policy the run started from (frozen), also after a resume
        self.ref = None
        if cfg.kl_coef:
            fresh = reference_path in (None, model_path)
            reference = (
                copy.deepcopy(self.model) if fresh else load_policy(str(model_dir(reference_path)), self.device)[0]
            )
            self.ref = self._sharded(reference.eval().requires_grad_(False))
        if cfg.lora_rank:  # the base frozen, adapters trained and pushed (learner/lora.py)
            self.model = apply_lora(self.model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
        if cfg.lean_activations:
            lean_activations(self.model)
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

    def _sharded(self, lm) -> ResponseScorer:
        scorer = ResponseScorer(lm)
        distributed.shard(scorer, lm.get_decoder().layers, self.device)
        return scorer

    def step(self, trajectories: list[Trajectory], timer: PhaseTimer | None = None) -> StepStats:
        """One learner step on a batch (an optimizer step per mini-batch, learner/step.py); `timer` gets the
        samples, score, forward_backward and optimizer phases."""
        timer = PhaseTimer(self.device) if timer is None else timer
        with timer.phase("samples"):
            samples = build_samples(
                trajectories,
                self.cfg.score_scale,
                self.intrinsic,
                self.cfg.adv_eps,
                self.gigpo,
                strip_guidance=self.herl is not None and self.herl.train_context == TrainContext.stripped,
            )
            samples, nonfinite = finite_samples(samples)
            if nonfinite:
                log.warning("dropped %d turn samples with a non-finite advantage or log-prob", nonfinite)
        stats = train_step(
            StepContext(
                model=self.scorer,
                optimizer=self.optimizer,
                samples=samples,
                cfg=self.cfg,
                version=self.version,
                ref_model=self.ref,
                scheduler=self.scheduler,
                timer=timer,
                memory_in_use=self.memory_in_use,
                seed=self.seed,
                hindsight_gamma=self.herl.gamma if self.herl else None,
            )
        )
        self.version += 1
        stats.samples_nonfinite = nonfinite
        release_free_heap()  # the step's activations, back to the kernel before the next step's shapes
        stats.resident_mb = status_mb()
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


def step_record(
    version: int,
    trajectories: list[Trajectory],
    stats: StepStats,
    phase_seconds: dict[str, float],
    step_s: float,
    push: PushTiming,
) -> dict:
    """One step's record: learner_summary.json's history, the metrics (LearnerMetrics.observe_step)
    and the log line. `version`: the policy version the step produced."""
    staleness = [version - 1 - v for t in trajectories for v in t.policy_versions.tolist()]
    modes = sorted({t.mode for t in trajectories})
    by_mode = {mode: [t for t in trajectories if t.mode == mode] for mode in modes}
    rollout_phases: dict[str, float] = {}
    for t in trajectories:
        for phase, seconds in t.phase_seconds.items():
            rollout_phases[phase] = rollout_phases.get(phase, 0.0) + seconds
    return {
        "record": "step",  # the metrics log also holds "eval" records (evaluation/eval.py)
        "step": version,
        "policy_version": version,
        "episodes": len(trajectories),
        "episode_score_mean": float(np.mean([t.score for t in trajectories])),
        "modes": modes,
        "episodes_by_mode": {mode: len(ts) for mode, ts in by_mode.items()},
        "score_mean_by_mode": {mode: float(np.mean([t.score for t in ts])) for mode, ts in by_mode.items()},
        "success_rate": float(np.mean([bool(t.success) for t in trajectories])),
        "success_rate_by_mode": {mode: float(np.mean([bool(t.success) for t in ts])) for mode, ts in by_mode.items()},
        "env_steps": sum(t.num_turns for t in trajectories),
        "generated_tokens": sum(int(t.response_token_ids.size) for t in trajectories),
        # the actors' time in the batch's episodes per phase (summed over episodes: actor-seconds)
        "rollout_phase_seconds": rollout_phases,
        "staleness_mean_versions": float(np.mean(staleness)),
        "staleness_max_versions": int(max(staleness)),
        "step_seconds": step_s,
        "weight_push_seconds": push.seconds,
        "weight_push_engine_seconds": push.engine_seconds,
        "phase_seconds": {phase: phase_seconds[phase] for phase in PHASES if phase in phase_seconds},
        # distinct states and actions, collapsed groups (learner/exploration.py); the entropy is entropy_mean
        **exploration_stats(trajectories),
        # how much the memory engaged: tip turns, retrievals, r_int's spread in groups (learner/memory_use.py)
        **memory_stats(trajectories),
        **{k: v for k, v in vars(stats).items()},
    }


class Learner:
    def __init__(self, learner: LearnerConfig, weight_sync: WeightSyncConfig, run: RunFacts, herl: HerlConfig):
        self.lcfg, self.weight_sync, self.run_facts = learner, weight_sync, run
        self.metrics = LearnerMetrics()
        if self.lcfg.torch_threads:
            torch.set_num_threads(self.lcfg.torch_threads)
        torch.manual_seed(run.seed)
        self.checkpoints = Path(run.run_dir) / "checkpoints"
        resume_from = list_checkpoints(self.checkpoints)[-1:] if self.lcfg.resume else []
        # a LoRA run resumes from the base model plus the adapter in the trainer state, else from the checkpoint's weights
        base_model = resolve_model(run.model.name, run.model.cache_dir or None)
        self.model_path = str(model_dir(resume_from[0])) if resume_from and not self.lcfg.lora_rank else base_model
        # "memory in use" is a property of the run (the paper masks whenever p > 0), derived once by
        # pipeline/ (RunFacts) rather than guessed from each batch's modes or restated as a learner key
        self.trainer = Trainer(
            self.lcfg,
            self.model_path,
            run.seed,
            resume_from[0] if resume_from else None,
            memory_in_use=run.memory_in_use,
            reference_path=base_model,
            herl=herl,
        )
        if resume_from:
            log.info("resumed from %s at policy version %d", resume_from[0], self.trainer.version)
        self.is_rank0 = distributed.rank() == 0  # rank 0 alone talks to the buffer and the servers
        # (version, path) of the newest checkpoint on disk: a version is never written twice
        self.saved = (self.version, str(resume_from[0]) if self.is_rank0 else "") if resume_from else (-1, "")
        self.history: list[dict] = []
        self._started = self._last_publish = time.time()  # the metrics log's wall clock
        self._last_checkpoint = time.monotonic()  # learner.checkpoint_every_s counts from here (rank 0's clock)
        self._next_catch_up = 0.0  # monotonic time of the next catch-up (catch_up)
        self.background: BackgroundPushes | None = None  # rank 0's, below
        if not self.is_rank0:
            return
        ctx = zmq.Context.instance()
        self.buffer = Client(ctx, run.endpoints.replay_buffer, timeout_s=60.0)
        self.policies = [Client(ctx, ep, timeout_s=self.lcfg.push_timeout_s) for ep in run.endpoints.policy_servers]
        run_id = hashlib.sha1(str(Path(run.run_dir).resolve()).encode()).hexdigest()[:12]
        # an NCCL group spans the learner and a server's tensor-parallel workers
        self.pusher = WeightPusher(
            weight_sync,
            self.policies,
            self.lcfg.push_timeout_s,
            run.server_tensor_parallel_size,
            self.lcfg.push_attempts,
            shm_name=f"run-{run_id}",
        )
        # pushes that never hold the learner: zmq (its chunks are a snapshot), one learner process (rank
        # 0 holds the whole model), asynchronous (the sync baseline plays every version in lockstep)
        background = learner.background_push and weight_sync.method == "zmq" and distributed.world_size() == 1
        self.background = (
            BackgroundPushes(list(run.endpoints.policy_servers), self.lcfg.push_timeout_s)
            if background and not run.sync
            else None
        )

    @property
    def version(self) -> int:
        return self.trainer.version

    def run(self) -> dict:
        def waiting(endpoint: str, left: float) -> None:
            beat()  # the start-up wait loop turns: progress (common/heartbeat.py)
            log.info("waiting for %s (%.0fs left)", endpoint, left)

        for client in [self.buffer, *self.policies] if self.is_rank0 else []:
            wait_until_ready(
                client,
                "learner",
                self.run_facts.startup_timeout_s,
                on_wait=lambda left, ep=client.endpoint: waiting(ep, left),
            )
        if self.version > 0:  # resumed: the servers start from the base model, give them ours
            self.push()
        elif self.is_rank0:  # a fresh start: the base model is the run's newest (protocol/newest_version.py)
            publish_newest_version(self.run_facts.run_dir, self.version)
        log.info("learner ready at policy version %d; training up to step %d", self.version, self.lcfg.total_steps)
        while self.version < self.lcfg.total_steps:
            timer = PhaseTimer(self.trainer.device)
            with timer.phase("batch_wait"):
                batch = distributed.broadcast_message(self.next_batch() if self.is_rank0 else None)
            t0 = time.perf_counter()
            stats = self.trainer.step(batch.trajectories, timer)
            step_s = time.perf_counter() - t0
            # The checkpoint first: a version a server serves, or a batch the buffer forgets, is one a
            # restarted learner resumes after. Pushed first, a learner killed before its checkpoint
            # left the servers a version it no longer had, and its resumed self pushed them back to
            # the one before (the chaos soak: v8, then v7 again).
            if self.checkpoint_due():
                with timer.phase("checkpoint"):
                    self.save_checkpoint()
            if self.is_rank0:  # used: the buffer may forget its groups (unconfirmed, they are served again)
                self.confirm(batch.batch_id)
            with timer.phase("push"):
                push = self.push()
            if self.is_rank0:
                self.publish(step_record(self.version, batch.trajectories, stats, timer.seconds, step_s, push))
        return self.finish()

    def push(self, clients: list[Client] | None = None) -> PushTiming | None:
        """Bring every policy server (or only `clients`: a catch-up) to the current weights
        (weight_sync.method), then publish the version as the run's newest. Every rank takes part in
        gathering them; rank 0 sends them and gets the timing (None elsewhere)."""
        if self.background is not None:
            return self.push_in_background(clients)
        if self.weight_sync.method == "checkpoint":  # every push is a checkpoint the servers load
            path = self.save_checkpoint()
            timing = self.pusher.push_checkpoint(Path(path), self.version, clients) if self.is_rank0 else None
        else:
            weights = self.trainer.full_weights()
            if not self.is_rank0:
                return None
            model = self.trainer.model
            timing = self.pusher.push(
                weight_tensors(model, weights), self.version, lora_scale(model) if is_lora(model) else 0.0, clients
            )
        if self.is_rank0:
            publish_newest_version(self.run_facts.run_dir, self.version)
        return timing

    def push_in_background(self, clients: list[Client] | None) -> PushTiming:
        """The current weights, snapshotted, to every server's push thread (or again, the newest, to
        `clients`: a catch-up); published as the run's newest at once, so a server (re)started now
        awaits them. The timing is the snapshot's: the learner waits for nothing else."""
        t0 = time.perf_counter()
        if clients is not None:
            for client in clients:
                self.background.resend(self.policies.index(client))
            return PushTiming(time.perf_counter() - t0, 0.0)
        model = self.trainer.model
        tensors = snapshot(weight_tensors(model, self.trainer.full_weights()))
        chunks = build_chunks(
            tensors, self.version, self.weight_sync.zmq_chunk_bytes, lora_scale(model) if is_lora(model) else 0.0
        )
        self.background.submit(self.version, chunks)
        publish_newest_version(self.run_facts.run_dir, self.version)
        return PushTiming(time.perf_counter() - t0, 0.0)

    def catch_up(self) -> None:
        """Push the current weights to each policy server that is behind: restarted (it loaded the
        base model and waits for the run's newest, its Pong says) or missed a version. Run while
        the learner waits for a batch, at most every CATCH_UP_EVERY_S; a server that does not answer
        the Ping within CATCH_UP_PING_S is left for the next time. Only where rank 0 holds the whole
        model (one learner process) and the method can reach one server alone (not nccl, whose
        groups are set up at start): elsewhere the next step's push brings it up to date."""
        now = time.monotonic()
        if now < self._next_catch_up or distributed.world_size() > 1 or self.weight_sync.method == "nccl":
            return
        self._next_catch_up = now + CATCH_UP_EVERY_S
        behind = []
        for client in self.policies:
            try:
                pong = client.call(Ping(sender="learner"), timeout_s=CATCH_UP_PING_S)
            except (RequestTimeout, RemoteError):
                continue
            if isinstance(pong, Pong) and pong.ready and (pong.policy_version < self.version or pong.awaiting_version):
                log.info(
                    "%s serves v%d (awaiting v%d): pushing v%d to it",
                    client.endpoint,
                    pong.policy_version,
                    pong.awaiting_version,
                    self.version,
                )
                behind.append(client)
        if behind:
            self.metrics.catch_up_pushes.inc(len(behind))
            self.push(behind)

    def next_batch(self) -> Batch:
        """The next batch, all of its parts in one Batch (each part fits this learner's message
        limit, the buffer's Client max_bytes). A timed-out request is asked again; a batch the
        buffer no longer has in flight (it restarted) is given up for a new one."""
        request = BatchRequest(
            learner_version=self.version,
            num_groups=self.lcfg.groups_per_step,
            max_staleness=self.lcfg.max_staleness,
            max_bytes=self.buffer.max_bytes,
            token=self.run_facts.security.learner_token,
        )
        while True:
            reply = self._call_buffer(request)
            if isinstance(reply, Wait):
                self.catch_up()  # the wait is when a restarted server can be brought up to date
                time.sleep(reply.retry_after_s)
                continue
            assert isinstance(reply, Batch)
            parts = [reply]
            try:
                while len(parts) < reply.num_parts:
                    part = dataclasses.replace(request, batch_id=reply.batch_id, part=len(parts))
                    parts.append(self._call_buffer(part))
            except RemoteError as exc:
                if exc.reason != "unknown_batch":
                    raise
                log.warning(
                    "batch %s is no longer in flight at the buffer (%s); asking for a new one", reply.batch_id, exc
                )
                continue
            trajectories = [t for p in parts for t in p.trajectories]
            return dataclasses.replace(reply, trajectories=trajectories, part=0, num_parts=1)

    def confirm(self, batch_id: str) -> None:
        """Tell the buffer the batch is used (BatchConfirm), so it is never served again."""
        if batch_id:
            self._call_buffer(BatchConfirm(batch_id=batch_id))

    def _call_buffer(self, msg):
        """buffer.call(msg), asked again after each timeout (the learner has nothing to do without it).
        Each attempt is progress of the wait (common/heartbeat.py): a hung buffer is found by its own."""
        while True:
            beat()
            try:
                return self.buffer.call(msg)
            except RequestTimeout as exc:
                log.warning("%s; asking the replay buffer again", exc)

    def publish(self, record: dict) -> None:
        record = {**record, **self.throughput(record)}
        if self.background is not None:  # how far each server is behind the learner, in versions
            lags = [self.version - max(v, 0) for v in self.background.acked]
            record.update(server_version_lag_max=max(lags), push_backlog=self.background.backlog())
            for endpoint, lag in zip(self.background.endpoints, lags):
                self.metrics.server_version_lag.labels(endpoint).set(lag)
        self.metrics.observe_step(record)
        self.history.append(record)
        with open(self.run_facts.run_path(METRICS_LOG), "a") as f:  # one line per step, for empo2-plot
            f.write(json.dumps(record) + "\n")
        log.info(
            "step %d: loss=%.4f samples=%d (masked %d) in %d sequences tokens=%d forwarded=%d optimizer_steps=%d "
            "score=%.1f ratio=%.3f clip=%.3f entropy=%.3f states/group=%.1f "
            "mismatch=%.2e/%.2e nats lr=%.2e step=%.1fs push=%.1fs phases: %s",
            record["step"],
            record["loss"],
            record["samples"],
            record["samples_masked"],
            record["segments"],
            record["tokens"],
            record["forward_tokens"],
            record["optimizer_steps"],
            record["episode_score_mean"],
            record["ratio_mean"],
            record["clip_fraction"],
            record["entropy_mean"],
            record["distinct_states_per_group"],
            record["logprob_mismatch_mean_nats"],
            record["logprob_mismatch_max_nats"],
            record["lr"],
            record["step_seconds"],
            record["weight_push_seconds"],
            " ".join(f"{phase}={seconds:.2f}s" for phase, seconds in record["phase_seconds"].items()),
        )

    def throughput(self, record: dict) -> dict:
        """Wall-clock fields of a step's record: the time, and the rates of each role since the
        previous step (env actors: episodes and env steps; policy servers: generated tokens of the
        batch; learner: trained tokens per second of its step)."""
        now = time.time()
        interval = max(now - self._last_publish, 1e-9)
        self._last_publish = now
        return {
            "wall_time": now,
            "elapsed_s": now - self._started,
            "interval_s": interval,
            "throughput": {
                "env_actor_episodes_per_s": record["episodes"] / interval,
                "env_actor_env_steps_per_s": record["env_steps"] / interval,
                "policy_server_tokens_per_s": record["generated_tokens"] / interval,
                "learner_tokens_per_s": record["tokens"] / max(record["step_seconds"], 1e-9),
                "learner_steps_per_hour": 3600.0 / interval,
            },
        }

    def checkpoint_due(self) -> bool:
        """After a step: every learner.checkpoint_every steps, or when learner.checkpoint_every_s have
        passed since the last checkpoint (or the start). Rank 0's clock decides for every rank: all take part."""
        if self.lcfg.checkpoint_every and self.version % self.lcfg.checkpoint_every == 0:
            return True
        if not self.lcfg.checkpoint_every_s:
            return False
        late = self.is_rank0 and time.monotonic() - self._last_checkpoint >= self.lcfg.checkpoint_every_s
        return distributed.all_reduce([float(late)])[0] > 0

    def save_checkpoint(self) -> str:
        """Every rank takes part; rank 0 writes it and gets its path ("" elsewhere). A version
        already on disk (resumed from, or written by a weight_sync.method=checkpoint push) is not rewritten."""
        if self.saved[0] != self.version:
            path = self.trainer.save_checkpoint(self.checkpoints, self.lcfg.keep_checkpoints)
            self.saved = (self.version, str(path) if path else "")
            self._last_checkpoint = time.monotonic()
        return self.saved[1]

    def finish(self) -> dict:
        if self.background is not None:  # the run ends with its last version served (bounded wait)
            limit = self.lcfg.push_timeout_s * self.lcfg.push_attempts
            if not self.background.wait(self.version, limit):
                lagging = [ep for ep, v in zip(self.background.endpoints, self.background.acked) if v < self.version]
                log.warning("after %.0fs, %s do not serve the last version v%d yet", limit, lagging, self.version)
        summary = {
            "steps": self.version,
            "policy_version": self.version,
            "final_checkpoint": self.save_checkpoint(),
            "history": self.history,
        }
        if not self.is_rank0:
            return summary
        self.run_facts.run_path("learner_summary.json").write_text(json.dumps(summary, indent=1))
        log.info(
            "done: %d steps, policy version %d, checkpoint %s", self.version, self.version, summary["final_checkpoint"]
        )
        return summary

    def close(self) -> None:
        if self.is_rank0:
            self.pusher.close()
            if self.background is not None:
                self.background.close()
        distributed.close()


def main(learner: LearnerConfig, weight_sync: WeightSyncConfig, herl: HerlConfig, run: RunFacts) -> None:
    run_role("learner", run, lambda: Learner(learner, weight_sync, run, herl))


if __name__ == "__main__":  # `python -m learner.train` once ran nothing and exited 0: say what to run
    raise SystemExit(
        "learner/train.py is not a command: run `empo2-learner [key=value ...]`, or on N devices "
        "`torchrun --nproc_per_node=N -m pipeline empo2-learner [key=value ...]`"
    )
