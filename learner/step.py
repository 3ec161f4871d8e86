"""One EMPO2 optimizer step over a batch of turn samples (docs/method.md, "Advantage and loss").

train_step reads: score without grad (the KL reference; the proximal policy of decoupled PPO over
several mini-batches; tip-free minimum log-probs for the legacy tip_rollouts mask) -> per
mini-batch (learner.mini_batch_samples, shuffled): per micro-batch: forward on the update prompt,
low-probability mask, the EMPO2 loss (learner/loss.py, empo2_loss), backward -> all-reduce the totals
by name -> optimizer step; the learning-rate schedule steps once per batch. Every phase is timed
(PHASES, PhaseTimer) and exported by the learner (empo2_learner_phase_seconds{phase=...}): the
paper's Figure 12.

Data parallelism is learner/distributed.py's: each rank scores its share of the samples and the
gradients are divided by the kept tokens of all ranks, so N ranks take the step one process takes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from common.heartbeat import beat
from common.process import release_free_heap
from learner import distributed
from learner.config import LearnerConfig, Packing
from learner.loss import LossInputs, empo2_loss, low_probability_mask, mask_subject
from learner.policy_model import Scored, batch_log_softmax, common_prefix, row_length, token_logprobs
from learner.samples import TurnSample
from protocol.messages import MODES, ON_POLICY, ON_POLICY_TIPS

PHASES = (
    "batch_wait",  # waiting for the replay buffer's Batch (rank 0) and its broadcast (every rank)
    "samples",  # turn samples: intrinsic reward, advantages
    "score",  # passes without grad before the update: KL reference, proximal policy, tip-free prompts
    "forward_backward",  # the micro-batch loops: forward, mask, loss, backward; the totals' all-reduce
    "optimizer",  # gradient mean, clip, optimizer steps (one per mini-batch), schedule step
    "push",  # new weights to every policy server
    "checkpoint",  # checkpoint written (steps at learner.checkpoint_every)
)


class PhaseTimer:
    """Wall seconds (time.perf_counter) of the named PHASES of one learner step that ran: the paper's
    Figure 12 time breakdown. On CUDA each phase ends with a synchronize, so that the kernels it queued
    count in it."""

    def __init__(self, device: torch.device | None = None):
        self.seconds: dict[str, float] = {}  # phase -> seconds, in the order the phases ran
        self._sync = torch.cuda.synchronize if device is not None and device.type == "cuda" else None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        assert name in PHASES, name
        start = time.perf_counter()
        try:
            yield
        finally:
            if self._sync is not None:
                self._sync()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def _summed(default: float = 0.0):
    return field(default=default, metadata={"reduce": "sum"})


def _maxed():
    return field(default=0.0, metadata={"reduce": "max"})


@dataclass
class StepTotals:
    """Running totals of one mini-batch: added up over a rank's micro-batches (`add`), then over the
    ranks (`all_reduce`), each field by its own reduction: sums but the maxima; then over the
    mini-batches of the batch (`add`). Token sums run over kept tokens (the low-probability mask
    applied)."""

    loss: float = _summed()  # Σ L_t
    kept_tokens: int = _summed(0)  # response tokens in the loss
    forward_tokens: int = _summed(0)  # tokens laid out in the forwards' rows (padding not counted)
    masked_samples: int = _summed(0)  # samples dropped by the low-probability mask
    masked_on_policy: int = _summed(0)  # of them, by mode
    masked_on_policy_tips: int = _summed(0)
    masked_off_policy: int = _summed(0)
    masked_tip_samples: int = _summed(0)  # of them, samples whose prompt showed tips (any mode)
    ratio: float = _summed()  # Σ r_t
    clipped: float = _summed()  # tokens where the clip bound the surrogate
    dual_clipped: float = _summed()  # tokens where the dual clip bound it (A < 0)
    approx_kl: float = _summed()  # Σ (r_t − 1) − log r_t
    behaviour_weight: float = _summed()  # Σ w_t (decoupled PPO; 1 per token when plain)
    behaviour_weight_capped: float = _summed()  # tokens over the behaviour-weight cap
    entropy: float = _summed()  # Σ H_t
    kl: float = _summed()  # Σ KL_t to the reference (if kl_coef)
    mismatch: float = _summed()  # Σ |log πθold − log πθ| on same-version, same-prompt tokens (mask or not)
    mismatch_tokens: int = _summed(0)
    # the rollout correction's mismatch, ρ_t = π_old/π_behaviour on the kept tokens but HeRL's (learner/loss.py)
    rollout_tokens: int = _summed(0)  # tokens judged
    rollout_kl: float = _summed()  # Σ k3 of KL(π_behaviour || π_old): ρ_t − 1 − log ρ_t
    rollout_weight: float = _summed()  # Σ w_t (1 per token under none)
    rollout_corrected: float = _summed()  # tokens whose weight was truncated (tis) or zeroed (mis, token_mask)
    rollout_corrected_samples: int = _summed(0)  # turn samples with a corrected token (mis: those dropped)
    ratio_max: float = _maxed()  # max r_t
    mismatch_max: float = _maxed()  # max |log πθold − log πθ|
    rollout_logratio_max: float = _maxed()  # max |log ρ_t|
    # p50 / p99 of |log ρ_t|, per micro-batch of a rank, maxed over micro-batches and ranks (a quantile does
    # not all-reduce): an upper bound of the step's, as no part of a split can sit wholly below its maximum
    rollout_logratio_p50: float = _maxed()
    rollout_logratio_p99: float = _maxed()

    def add(self, other: StepTotals) -> None:
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, max(a, b) if f.metadata["reduce"] == "max" else a + b)

    def all_reduce(self) -> StepTotals:
        """Every rank's totals, each field by name with its own op (a collective: every rank calls it)."""
        reduced = {}
        for kind, op in (("sum", distributed.dist.ReduceOp.SUM), ("max", distributed.dist.ReduceOp.MAX)):
            names = [f.name for f in fields(self) if f.metadata["reduce"] == kind]
            reduced |= dict(zip(names, distributed.all_reduce([getattr(self, n) for n in names], op)))
        return StepTotals(**{f.name: type(f.default)(reduced[f.name]) for f in fields(self)})  # ints stay ints


@dataclass
class StepStats:
    """One learner step (one batch, one policy version): over all its mini-batches and epochs, token
    means over every kept token; mask counts over every pass (a sample counts once per epoch)."""

    loss: float  # token-mean policy loss of the step
    samples: int
    samples_masked: int  # sample passes dropped by the mask (samples x update_epochs passes in all)
    masked_fraction: float  # samples_masked / (samples x passes)
    # the same by mode (None: no sample of that mode in the batch)
    masked_fraction_on_policy: float | None
    masked_fraction_on_policy_tips: float | None
    masked_fraction_off_policy: float | None
    tokens: int
    forward_tokens: int  # tokens the update pass forwarded (every pass and epoch), its cost: learner.packing
    segments: int  # sequences the batch's turn samples were scored in (as many as samples under packing=turn)
    ratio_mean: float
    ratio_max: float
    clip_fraction: float
    dual_clip_fraction: float
    approx_kl: float
    behaviour_weight_mean: float  # decoupled PPO: mean πprox/πbehaviour over kept tokens (1 when plain)
    behaviour_weight_capped_fraction: float  # decoupled PPO: tokens dropped over the cap
    entropy_mean: float  # mean policy entropy (nats) at the kept response positions, at every step
    kl_mean: float  # mean k3 KL to the initial policy (0 unless kl_coef)
    lr: float  # learning rate of this step (learner.lr times the schedule's factor)
    advantage_abs_mean: float
    # samples whose advantage is 0 (their group's episodes all scored the same): no policy gradient
    zero_advantage_fraction: float
    logprob_mismatch_mean_nats: float  # |vLLM - learner| on same-version, same-prompt tokens
    logprob_mismatch_max_nats: float
    mismatch_tokens: int
    optimizer_steps: int  # optimizer steps taken: one per mini-batch with a kept token
    # samples whose rollout prompt showed tips (with_tips, any mode), and the share of their passes the
    # mask kept: the tip turns that contributed gradient (None: no such sample)
    tip_samples: int = 0
    tip_samples_trained_fraction: float | None = None
    samples_nonfinite: int = 0  # dropped before the step: a non-finite advantage or behaviour log-prob
    # the learner's resident memory after the step, its freed heap given back (learner/train.py): the
    # floor that a leak raises, where the peak follows the step's micro-batches (0: not measured)
    resident_mb: float = 0.0
    # the servers' behaviour policy against the learner's before the update (learner.rollout_correction),
    # ρ_t = π_old/π_behaviour on the kept tokens (HeRL's hindsight tokens aside), at every step (under none
    # with several mini-batches and no pass of πprox, π_old is the mini-batch's weights: no pass for a metric)
    rollout_kl_mean: float = 0.0  # k3 estimate of KL(π_behaviour || π_old) per token: ρ_t − 1 − log ρ_t
    rollout_logratio_abs_max: float = 0.0  # max |log ρ_t|
    rollout_logratio_abs_p50: float = 0.0  # p50 / p99 of |log ρ_t|: the largest of any micro-batch of any rank
    rollout_logratio_abs_p99: float = 0.0
    rollout_weight_mean: float = 0.0  # mean w_t (1 under none)
    rollout_corrected_fraction: float = 0.0  # tokens truncated (tis) or given no gradient (mis, token_mask)
    rollout_corrected_samples: int = 0  # sample passes with a corrected token (mis: dropped whole)

    @classmethod
    def from_totals(
        cls,
        totals: StepTotals,
        samples: list[TurnSample],
        lr: float,
        optimizer_steps: int = 1,
        passes: int = 1,
        segments: int | None = None,
    ) -> StepStats:
        """The step's statistics from every rank's totals of every mini-batch: token means over the
        kept tokens (the mismatch over its own tokens); `samples` is the whole batch (every rank's),
        seen `passes` times (learner.update_epochs)."""
        kept = max(totals.kept_tokens, 1)
        per_mode = {mode: passes * sum(s.mode == mode for s in samples) for mode in MODES}
        tip_samples = sum(s.with_tips for s in samples)
        return cls(
            loss=totals.loss / kept,
            samples=len(samples),
            samples_masked=totals.masked_samples,
            masked_fraction=totals.masked_samples / max(passes * len(samples), 1),
            **{
                f"masked_fraction_{mode}": getattr(totals, f"masked_{mode}") / n if n else None
                for mode, n in per_mode.items()
            },
            tokens=totals.kept_tokens,
            forward_tokens=totals.forward_tokens,
            segments=len(samples) if segments is None else segments,
            ratio_mean=totals.ratio / kept,
            ratio_max=totals.ratio_max,
            clip_fraction=totals.clipped / kept,
            dual_clip_fraction=totals.dual_clipped / kept,
            approx_kl=totals.approx_kl / kept,
            behaviour_weight_mean=totals.behaviour_weight / kept,
            behaviour_weight_capped_fraction=totals.behaviour_weight_capped / kept,
            entropy_mean=totals.entropy / kept,
            kl_mean=totals.kl / kept,
            lr=lr,
            advantage_abs_mean=float(np.mean([abs(s.advantage) for s in samples])) if samples else 0.0,
            zero_advantage_fraction=float(np.mean([abs(s.advantage) < 1e-8 for s in samples])) if samples else 0.0,
            logprob_mismatch_mean_nats=totals.mismatch / max(totals.mismatch_tokens, 1),
            logprob_mismatch_max_nats=totals.mismatch_max,
            mismatch_tokens=totals.mismatch_tokens,
            optimizer_steps=optimizer_steps,
            tip_samples=tip_samples,
            tip_samples_trained_fraction=1.0 - totals.masked_tip_samples / (passes * tip_samples)
            if tip_samples
            else None,
            rollout_kl_mean=totals.rollout_kl / max(totals.rollout_tokens, 1),
            rollout_logratio_abs_max=totals.rollout_logratio_max,
            rollout_logratio_abs_p50=totals.rollout_logratio_p50,
            rollout_logratio_abs_p99=totals.rollout_logratio_p99,
            rollout_weight_mean=totals.rollout_weight / max(totals.rollout_tokens, 1),
            rollout_corrected_fraction=totals.rollout_corrected / max(totals.rollout_tokens, 1),
            rollout_corrected_samples=totals.rollout_corrected_samples,
        )


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Bucketing: row indices sorted by length and grouped so that each right-padded micro-batch
    holds at most `budget` tokens (its size times its longest length); a row longer than the
    budget goes alone, so budget 1 scores one row at a time."""
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
    update_prompt=np.zeros(1, np.int32),
    tipfree_prompt=np.zeros(1, np.int32),
    response=np.zeros(1, np.int32),
    behaviour_logp=np.zeros(1, np.float32),
    advantage=0.0,
    mode=ON_POLICY,
    policy_version=-1,
    with_tips=False,
)
# a row shares its sequences' common prefix only when it is at least this long: below it the saving is
# smaller than what the [B, 1, L, L] mask costs (every sequence shares the chat template's first tokens)
MIN_SHARED_PREFIX = 32


def _ids(tokens: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(tokens.astype(np.int64)).to(device)


def _extends(before: TurnSample, after: TurnSample) -> bool:
    """`after`'s update prompt (and tip-free prompt) starts with `before`'s and its response."""

    def starts_with(prompt: np.ndarray, head: np.ndarray) -> bool:
        return len(prompt) >= len(head) and np.array_equal(prompt[: len(head)], head)

    return starts_with(after.update_prompt, np.concatenate([before.update_prompt, before.response])) and starts_with(
        after.tipfree_prompt, np.concatenate([before.tipfree_prompt, before.response])
    )


def segments(samples: list[TurnSample], packing: Packing | str) -> list[list[int]]:
    """The samples scored in one sequence each (learner.packing): every sample alone (turn), or each
    run of samples that continue one another (episode, group). A `continues` sample whose prompts do
    not extend the previous one's starts a segment of its own (the replay buffer's validation
    already refuses such a trajectory: Trajectory.extends_previous)."""
    out: list[list[int]] = []
    for i, s in enumerate(samples):
        if packing != Packing.turn and s.continues and out and _extends(samples[out[-1][-1]], s):
            out[-1].append(i)
        else:
            out.append([i])
    return out


def chain(samples: list[TurnSample], tipfree: bool = False) -> Scored:
    """The one sequence of a segment's samples (each continuing the one before): the last one's
    update prompt (or tip-free prompt) and response, every sample's response scored where it lies."""
    prompt = (lambda s: s.tipfree_prompt) if tipfree else (lambda s: s.update_prompt)
    last = samples[-1]
    tokens = np.concatenate([prompt(last), last.response])
    return Scored(tokens, [(len(prompt(s)), len(s.response)) for s in samples], [s.temperatures for s in samples])


def rows(seqs: list[Scored], budget: int, share: bool) -> tuple[list[list[int]], list[int]]:
    """The sequences as rows of a forward batch, each a list of indices into `seqs`, and each row's
    tokens (row_length): one sequence each, or with `share` (learner.packing=group) sequences with a
    common prefix of at least MIN_SHARED_PREFIX tokens in one row, as long as the row stays within
    `budget` tokens (the prefix counted once). Sorting the sequences by their tokens puts those with
    a common prefix together (a group's episodes, and the groups of one task variation)."""
    if not share:
        return [[j] for j in range(len(seqs))], [len(s.tokens) for s in seqs]
    out: list[list[int]] = []
    lengths: list[int] = []
    for j in sorted(range(len(seqs)), key=lambda j: seqs[j].tokens.tolist()):
        if out:
            shared = common_prefix(seqs[out[-1][0]].tokens, seqs[j].tokens)
            length = row_length([seqs[k] for k in out[-1]] + [seqs[j]])
            if shared >= MIN_SHARED_PREFIX and length <= budget:
                out[-1].append(j)
                lengths[-1] = length
                continue
        out.append([j])
        lengths.append(len(seqs[j].tokens))
    return out, lengths


def score_without_grad(model, seqs: list[Scored], budget: int, share: bool = False) -> list[list[torch.Tensor]]:
    """[T] log-probs of each span of each sequence under `model`, in micro-batches of rows, no graph."""
    device = next(model.parameters()).device
    out: list[list[torch.Tensor]] = [[] for _ in seqs]
    laid, lengths = rows(seqs, budget, share)
    with torch.no_grad():
        for mb in distributed.synced(micro_batches(lengths, budget)):
            beat()  # a step takes minutes on a CPU: each micro-batch is progress (common/heartbeat.py)
            batch = [[seqs[j] for j in laid[r]] for r in mb] or [[chain([_PAD])]]
            targets = torch.from_numpy(np.concatenate([s.targets() for row in batch for s in row]).astype(np.int64))
            logp = token_logprobs(batch_log_softmax(model, batch), targets.to(device))
            parts = iter(logp.split([n for row in batch for s in row for _, n in s.spans]))
            for j in [j for r in mb for j in laid[r]]:
                out[j] = [next(parts) for _ in seqs[j].spans]
    return out


def rank_rows(
    samples: list[TurnSample], segs: list[list[int]], budget: int, share: bool
) -> tuple[list[list[list[int]]], list[int]]:
    """This rank's rows of a mini-batch's segments and their tokens: the rows (`rows`; each a list of
    segments, each a list of sample indices) sorted by length, every world_size-th (all of them in a
    single process)."""
    laid, lengths = rows([chain([samples[i] for i in seg]) for seg in segs], budget, share)
    mine = sorted(range(len(laid)), key=lengths.__getitem__)[distributed.rank() :: distributed.world_size()]
    return [[segs[j] for j in laid[k]] for k in mine], [lengths[k] for k in mine]


def mini_batch_plan(sizes: list[int], size: int, epochs: int, seed: int | None, version: int) -> list[list[int]]:
    """The segment indices of each optimizer step of one batch (learner.mini_batch_samples = `size`
    turn samples, learner.update_epochs = `epochs`), given each segment's turn samples (`sizes`):
    per epoch, the segments shuffled and cut into ceil(samples / size) mini-batches of near-equal
    turn samples (numpy's array_split of the samples; a segment is never split, so a mini-batch
    takes a whole segment and the next one fewer); size 0, or one at least the batch, is one step
    per epoch over the whole batch (its order does not matter then). The shuffle is seeded by
    (seed, version): reproducible, and the same on every rank."""
    total = sum(sizes)
    steps = 1 if size == 0 else max(1, -(-total // size))
    quotas = np.cumsum([len(part) for part in np.array_split(np.arange(total), steps)])
    rng = np.random.default_rng([(seed or 0) % 2**32, version])
    plan = []
    for _ in range(epochs):
        order = rng.permutation(len(sizes)) if steps > 1 else np.arange(len(sizes))
        parts: list[list[int]] = [[] for _ in range(steps)]
        filled = 0  # turn samples before segment j: it goes to the first step whose quota is not yet filled
        for j in order.tolist():
            parts[min(int(np.searchsorted(quotas, filled, side="right")), steps - 1)].append(j)
            filled += sizes[j]
        plan += [part for part in parts if part] or [[]]  # an empty batch: one (empty) pass
    return plan


@dataclass
class PreScores:
    """What the update pass needs from the passes without grad, per sample (score_before_update)."""

    # learner.low_prob_mask=tip_rollouts: min_t log πθ(a_t | s) on the tip-free prompt, where the update
    # prompt has tips (on-policy with tips); None elsewhere: the update pass's log-probs decide (always, paper)
    mask_logp_min: list[float | None]
    ref_logp: list[torch.Tensor] | None  # [T] log πref(a_t | s') of the KL reference; None without one
    # [T] log πprox(a_t | s'): decoupled PPO over several mini-batches, the learner's policy before the
    # batch's first optimizer step (AReaL). None: the update pass's own log-probs (detached) are πprox, as
    # they are the weights before the step when the batch takes a single one
    proximal_logp: list[torch.Tensor] | None = None

    def take(self, indices: list[int]) -> PreScores:
        def pick(values):
            return None if values is None else [values[i] for i in indices]

        return PreScores(pick(self.mask_logp_min), pick(self.ref_logp), pick(self.proximal_logp))


def sampled_logp_min(sample: TurnSample, logp: torch.Tensor) -> float:
    """The lowest log-prob among the tokens the policy sampled (the low-probability mask's judge; the
    actor's glue is not judged); 0 when there are none."""
    if sample.sampled is not None:
        logp = logp[torch.from_numpy(sample.sampled).to(logp.device)]
    return float(logp.min()) if logp.numel() else 0.0


def sampled_mask(samples: list[TurnSample], lengths: list[int], device) -> torch.Tensor:
    """[ΣT] bool: the tokens the policy sampled, over the samples' responses in order."""
    parts = [np.ones(n, bool) if s.sampled is None else s.sampled for s, n in zip(samples, lengths)]
    return torch.from_numpy(np.concatenate(parts or [np.ones(0, bool)])).to(device)


def score_before_update(
    model,
    ref_model,
    samples: list[TurnSample],
    budget: int,
    tipfree_mask: bool,
    proximal: bool = False,
    segs: list[list[int]] | None = None,
    share: bool = False,
) -> PreScores:
    """The passes without grad, packed as the update pass is (`segs`: the segments to score, each a
    list of sample indices; default every sample alone), indexed by sample: with `tipfree_mask`
    (learner.low_prob_mask=tip_rollouts) the tip-free chains of the segments updated with tips, then
    every update chain under the KL reference, if any, and with `proximal` under the policy itself
    (decoupled PPO's πprox). The paper's mask needs no pass of its own: it judges the update pass."""
    segs = [[i] for i in range(len(samples))] if segs is None else segs

    def judged_tipfree(i: int) -> bool:
        return tipfree_mask and samples[i].with_tips and samples[i].mode == ON_POLICY_TIPS

    def per_sample(scored_segs: list[list[int]], tipfree: bool, scorer) -> list:
        out: list = [None] * len(samples)
        seqs = [chain([samples[i] for i in seg], tipfree) for seg in scored_segs]
        for seg, logps in zip(scored_segs, score_without_grad(scorer, seqs, budget, share)):
            for i, lp in zip(seg, logps):
                out[i] = lp
        return out

    tipfree = per_sample([seg for seg in segs if any(judged_tipfree(i) for i in seg)], True, model)
    mask_logp_min = [
        sampled_logp_min(samples[i], lp) if lp is not None and judged_tipfree(i) else None
        for i, lp in enumerate(tipfree)
    ]
    ref_logp = None if ref_model is None else per_sample(segs, False, ref_model)
    proximal_logp = per_sample(segs, False, model) if proximal else None
    return PreScores(mask_logp_min, ref_logp, proximal_logp)


def micro_batch_loss(
    model,
    samples: list[TurnSample],
    pre: PreScores,
    cfg: LearnerConfig,
    version: int,
    memory_in_use: bool = True,
    layout: list[list[int]] | None = None,
    hindsight_gamma: float | None = None,
) -> tuple[torch.Tensor, StepTotals]:
    """[N] per-token EMPO2 loss L_t of the micro-batch's kept tokens (learner/loss.py), to be summed
    and back-propagated, and the micro-batch's totals. `pre`: the samples' scores without grad
    (score_before_update). `memory_in_use`: replay_buffer.p_memory > 0, for the paper's mask.
    `layout`: the forward's rows, each the number of samples of each of its segments, consecutive
    in `samples` (default: every sample its own row). Everything after the forward is per turn
    sample, whatever the packing. No samples (a rank with no micro-batch left): a pad sample is
    scored, never in the loss, so that every rank runs the same forwards and backwards (FSDP)."""
    device = next(model.parameters()).device
    batch = samples or [_PAD]
    layout = layout if samples and layout is not None else [[1]] * len(batch)
    parts = iter(batch)
    forward_rows = [[chain([next(parts) for _ in range(n)]) for n in row] for row in layout]
    lengths = torch.tensor([len(s.response) for s in batch], device=device)
    split = lengths.tolist()
    # log πθ(a_t | s'), s' the update prompt: with tips on-policy, tips removed off-policy (Table 3)
    log_softmax = batch_log_softmax(model, forward_rows)  # [T, V]
    logp = token_logprobs(log_softmax, torch.cat([_ids(s.response, device) for s in batch]))  # [T]
    # log πθold(a_t | s, tips if shown): what the policy server sampled with
    behaviour_logp = torch.from_numpy(np.concatenate([s.behaviour_logp for s in batch])).to(device)  # [T]
    sampled = sampled_mask(batch, split, device)  # [T] the tokens the policy sampled (not SGE's glue)
    per_sample = list(zip(samples, logp.detach().split(split), behaviour_logp.split(split), sampled.split(split)))
    # low-probability mask (Figure 6): a sample the rule judges leaves whole if min_t log πθ(a_t | ·) < τ, on
    # its update prompt (the tip-free pre-score of an on-policy-with-tips sample under tip_rollouts)
    kept = [
        low_probability_mask(
            m if m is not None else sampled_logp_min(s, lp),
            mask_subject(cfg.low_prob_mask, memory_in_use, s.with_tips),
            cfg.low_prob_threshold,
        )
        for (s, lp, _, _), m in zip(per_sample, pre.mask_logp_min)
    ]

    def per_token(values: list, dtype: torch.dtype | None = None) -> torch.Tensor:
        """[T] each sample's value, repeated over its response tokens."""
        return torch.repeat_interleave(torch.tensor(values, dtype=dtype, device=device), lengths)

    def pre_scored(logps: list[torch.Tensor] | None) -> torch.Tensor | None:
        """[T] the samples' log-probs from a pass without grad (the pad's: a placeholder, never kept)."""
        return None if logps is None else torch.cat(logps or [torch.zeros(1, device=device)]).to(device)

    inputs = LossInputs(
        logp=logp,
        log_softmax=log_softmax,
        behaviour_logp=behaviour_logp,
        proximal_logp=pre_scored(pre.proximal_logp),
        ref_logp=pre_scored(pre.ref_logp),
        advantages=per_token([s.advantage for s in batch], torch.float32),
        hindsight=per_token([s.hindsight for s in batch]),
        sample=torch.repeat_interleave(torch.arange(len(batch), device=device), lengths),
        keep=per_token(kept or [False]) & sampled,
    )
    loss, metrics = empo2_loss(inputs, cfg, hindsight_gamma)
    # the engines' mismatch, where the learner scores what the server scored with the same weights (mask or not)
    gaps = [
        (lp - b).abs()[m] for s, lp, b, m in per_sample if s.policy_version == version and s.update_is_behaviour_prompt
    ]
    totals = StepTotals(
        forward_tokens=sum(row_length(row) for row in forward_rows) if samples else 0,
        masked_samples=kept.count(False),
        **{f"masked_{mode}": sum(not k and s.mode == mode for s, k in zip(samples, kept)) for mode in MODES},
        masked_tip_samples=sum(not k and s.with_tips for s, k in zip(samples, kept)),
        mismatch=sum(float(g.sum()) for g in gaps),
        mismatch_tokens=sum(g.numel() for g in gaps),
        mismatch_max=max((float(g.max()) for g in gaps), default=0.0),
        **metrics,
    )
    return loss, totals


def optimizer_step(model, optimizer, kept_tokens: int, max_grad_norm: float) -> bool:
    """θ ← θ − lr · clip(∇ Σ L_t / kept tokens): the summed gradients become the token mean's. No
    step when nothing was kept (every sample masked). True if it stepped."""
    if not kept_tokens:
        return False
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(kept_tokens)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return True


@dataclass
class StepContext:
    """What one train_step works with: the policy, its optimizer and schedule, the batch, and the run's facts."""

    model: torch.nn.Module  # the policy (the learner's ResponseScorer, FSDP-sharded on several ranks)
    optimizer: torch.optim.Optimizer
    samples: list[TurnSample]  # the batch (every rank's: each takes its share)
    cfg: LearnerConfig
    version: int  # the policy version the batch updates: the engines' mismatch is measured on its samples
    ref_model: torch.nn.Module | None = None  # the frozen KL reference (learner.kl_coef); None without one
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None  # the learning-rate schedule
    timer: PhaseTimer | None = None  # gets the score, forward_backward and optimizer phases
    # replay_buffer.p_memory > 0: turns the paper's low-probability mask on (learner.low_prob_mask=paper)
    memory_in_use: bool = True
    seed: int | None = None  # the run's seed: with `version`, the mini-batch shuffle's
    hindsight_gamma: float | None = None  # herl.gamma, for the batch's HeRL hindsight samples (required then)


def train_step(ctx: StepContext) -> StepStats:
    """One learner step over a batch: one optimizer step per mini-batch, each the token mean of the
    EMPO2 loss over that mini-batch's kept tokens.

    The batch is shuffled and split into mini-batches (mini_batch_plan: learner.mini_batch_samples,
    learner.update_epochs; the shuffle seeded by `seed` and `version`, the same on every rank);
    0 or a size at least the batch is a single step. In each mini-batch every rank takes every
    world_size-th sample by length (learner/distributed.py; all of them in a single process) and
    scores its share in micro-batches of at most cfg.micro_batch_tokens padded tokens, sorted by
    length. Each micro-batch's loss *sum* is back-propagated; the gradients, summed over ranks,
    are divided by the kept tokens of all ranks of that mini-batch, which is exactly the token mean
    without knowing the low-probability mask in advance (it is decided per sample after its
    forward). The learning-rate schedule steps once, at the end (once per policy version).
    """
    model, optimizer, samples, cfg = ctx.model, ctx.optimizer, ctx.samples, ctx.cfg
    device = next(model.parameters()).device
    timer = PhaseTimer(device) if ctx.timer is None else ctx.timer
    distributed.init(device.type)  # a plain caller gets a group of one
    share, budget = cfg.packing == Packing.group, cfg.micro_batch_tokens
    segs = segments(samples, cfg.packing)
    sizes = [len(seg) for seg in segs]
    plan = mini_batch_plan(sizes, cfg.mini_batch_samples, cfg.update_epochs, ctx.seed, ctx.version)
    plan = [rank_rows(samples, [segs[j] for j in mb], budget, share) for mb in plan]  # this rank's rows of each
    mine = sorted({tuple(seg) for mb, _ in plan for row in mb for seg in row})  # every segment it updates on
    model.train()
    optimizer.zero_grad(set_to_none=True)
    with timer.phase("score"):
        pre = score_before_update(
            model,
            ctx.ref_model,
            samples,
            budget,
            tipfree_mask=cfg.low_prob_mask == "tip_rollouts",
            # πprox (decoupled PPO) and HeRL's πold: the weights before the first step
            proximal=(cfg.ratio == "decoupled" or cfg.rollout_correction != "none" or any(s.hindsight for s in samples))
            and len(plan) > 1,
            segs=[list(seg) for seg in mine],
            share=share,
        )
    totals, steps = StepTotals(), 0
    for mini, lengths in plan:
        with timer.phase("forward_backward"):
            optimizer.zero_grad(set_to_none=True)
            mb_totals = StepTotals()
            for micro in distributed.synced(micro_batches(lengths, budget)):
                beat()
                chosen = [mini[j] for j in micro]  # rows of segments of sample indices
                order = [i for row in chosen for seg in row for i in seg]
                loss, micro_totals = micro_batch_loss(
                    model,
                    [samples[i] for i in order],
                    pre.take(order),
                    cfg,
                    ctx.version,
                    ctx.memory_in_use,
                    layout=[[len(seg) for seg in row] for row in chosen],
                    hindsight_gamma=ctx.hindsight_gamma,
                )
                if loss.device.type == "cpu":
                    # the forward's freed temporaries, back to the kernel before the backward's: on CPU
                    # they stay in glibc's heap between the activations kept (a 3-row 3.9k-token
                    # micro-batch: 4.6 -> 3.2 GB held, ~0.1 s; common/process.py says why they stay)
                    release_free_heap()
                loss.sum().backward()  # also with nothing kept: every rank runs the same backwards (FSDP)
                mb_totals.add(micro_totals)
            mb_totals = mb_totals.all_reduce()  # every rank's share of the mini-batch
        with timer.phase("optimizer"):
            steps += optimizer_step(model, optimizer, mb_totals.kept_tokens, cfg.max_grad_norm)
        totals.add(mb_totals)
    with timer.phase("optimizer"):
        lr = optimizer.param_groups[0]["lr"]  # the batch's: the schedule steps once per policy version
        if ctx.scheduler is not None:
            ctx.scheduler.step()
    return StepStats.from_totals(
        totals, samples, lr, optimizer_steps=steps, passes=cfg.update_epochs, segments=len(segs)
    )
