"""SPA's SFT: the collected episodes with the true states substituted (spa/states.py), one sequence per
episode, the loss the token mean of the trained turns' cross-entropy (state tokens included), AdamW
(spa.betas, spa.weight_decay), spa.lr with a spa.warmup_fraction linear warm-up then cosine to 0,
gradients clipped at spa.max_grad_norm, spa.batch_rows rows (assistant turns) per optimizer step,
spa.epochs passes. The learner's model code scores the sequences (learner/policy_model.py) and saves the
checkpoints (learner/checkpoint.py: an HF directory that vLLM and empo2-run load), one per epoch under
<run_dir>/spa/sft/: a rerun resumes after the last complete epoch.

The episodes are split spa.holdout_fraction / rest at random (spa.split_seed), by episode (the paper
splits rows; splitting episodes keeps an episode's earlier turns, which its later rows read, out of
the other side). On the held-out episodes, before the first step and after every epoch: the loss, and
the next-state accuracy, the fraction of trained turns whose predicted location and inventory the model
gets exactly right token for token (greedy, given the true turn before them). Into
<run_dir>/spa/sft_report.json.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from actors.env_actor.prompts import Demonstration, PromptBuilder, TaskContext
from actors.env_actor.turn_format import WORLD_MODEL_INSTRUCTIONS
from common.model_prep import resolve_model
from learner.checkpoint import list_checkpoints, load_trainer_state, save_checkpoint
from learner.optim import lr_factor
from learner.policy_model import Scored, batch_log_softmax, load_policy, token_logprobs
from pipeline.config import PipelineConfig
from spa.collect import EPISODES_FILE, read_episodes, spa_dir
from spa.config import Malformed
from spa.states import CollectedTurn, Sequence, episode_sequence

REPORT = "sft_report.json"


def sequences(records: list[dict], builder: PromptBuilder, cfg: PipelineConfig) -> list[Sequence]:
    """Each collected episode as one SFT sequence with its trained spans (episodes with none left out)."""
    out = []
    for r in records:
        demo = r["demonstration"]
        ctx = TaskContext(
            r["task_description"],
            None if demo is None else Demonstration(demo["variation"], demo["task_description"], demo["actions"]),
            r["action_templates"],
            format_instructions=WORLD_MODEL_INSTRUCTIONS,
        )
        turns = [CollectedTurn(**t) for t in r["turns"]]
        seq = episode_sequence(builder, ctx, turns, cfg.spa.max_length, cfg.spa.malformed == Malformed.rebuild)
        if seq.rows:
            out.append(seq)
    return out


def sft_device(choice: str) -> torch.device:
    """spa.device (auto | cpu | cuda): cuda without a visible GPU stops here, saying so."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("[spa sft] spa.device=cuda but torch sees no CUDA device; use spa.device=cpu or auto")
    return torch.device("cuda" if choice != "cpu" and torch.cuda.is_available() else "cpu")


def split(items: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, held out): a seeded shuffle, the first `fraction` held out (at least one when there are two)."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    n = min(max(1, round(fraction * len(items))), len(items) - 1) if len(items) > 1 and fraction > 0 else 0
    return [items[i] for i in order[n:]], [items[i] for i in order[:n]]


def _scored(model, seq: Sequence, extra: list[tuple[int, int]] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """[ΣT] log-probs of the trained spans' tokens, and [ΣT', V] log-softmax at `extra` spans."""
    spans = [*seq.spans, *extra]
    scored = Scored(seq.tokens, spans)
    log_softmax = batch_log_softmax(model, [[scored]])
    n = sum(length for _, length in seq.spans)
    targets = torch.from_numpy(scored.targets().astype(np.int64)).to(log_softmax.device)
    return token_logprobs(log_softmax[:n], targets[:n]), log_softmax[n:]


@torch.no_grad()
def held_out(model, seqs: list[Sequence]) -> dict:
    """The held-out loss (token mean) and next-state accuracy (exact predicted location and inventory)."""
    model.eval()
    nll, tokens, exact, predicted = 0.0, 0, 0, 0
    for seq in seqs:
        logp, at_predictions = _scored(model, seq, seq.predictions)
        nll -= float(logp.sum())
        tokens += logp.numel()
        argmax = at_predictions.argmax(-1).cpu().numpy()
        offset = 0
        for start, length in seq.predictions:
            exact += int(np.array_equal(argmax[offset : offset + length], seq.tokens[start : start + length]))
            offset += length
        predicted += len(seq.predictions)
    model.train()
    return {
        "loss": nll / max(tokens, 1),
        "tokens": tokens,
        "next_state_accuracy": exact / predicted if predicted else None,
        "predictions": predicted,
    }


def batches(seqs: list[Sequence], rows: int, seed: int) -> list[list[Sequence]]:
    """One epoch's optimizer steps: the sequences shuffled (seeded per epoch), grouped until each step
    holds at least `rows` trained turns."""
    order = list(seqs)
    random.Random(seed).shuffle(order)
    out, current = [], []
    for seq in order:
        current.append(seq)
        if sum(s.rows for s in current) >= rows:
            out.append(current)
            current = []
    return out + ([current] if current else [])


@dataclass
class EpochReport:
    epoch: int
    train_loss: float
    seconds: float
    tokens_per_s: float
    held_out: dict


def sft(cfg: PipelineConfig) -> Path:
    """Fine-tune model.name on the collected episodes; returns the final checkpoint."""
    spa = cfg.spa
    root = spa_dir(cfg)
    records = list(read_episodes(root / EPISODES_FILE).values())
    if not records:
        raise SystemExit(f"[spa sft] no collected episodes in {root / EPISODES_FILE}: run `empo2-spa collect` first")
    device = sft_device(spa.device)
    checkpoints = list_checkpoints(root / "sft")
    start_path = resolve_model(str(checkpoints[-1]) if checkpoints else cfg.model.name, cfg.model.cache_dir or None)
    model, tokenizer = load_policy(start_path, device)
    builder = PromptBuilder(tokenizer, cfg.env_actor.history_window, spa.max_length - spa.max_turn_tokens)
    seqs = sequences(sorted(records, key=lambda r: r["seed"]), builder, cfg)
    if not seqs:
        turns = sum(len(r["turns"]) for r in records)
        raise SystemExit(
            f"[spa sft] none of the {turns} collected turns is well-formed (<observation>, <prediction>, <answer>): "
            "nothing to train; the model does not follow the world-model format. spa.malformed=rebuild trains them "
            "rebuilt from the true states and the actions executed"
        )
    train, held = split(seqs, spa.holdout_fraction, spa.split_seed)
    # each epoch's steps, planned once: how the sequences group depends on the epoch's shuffle, so the
    # schedule's length is the sum over the epochs, not one epoch's count times the epochs
    plan = {epoch: batches(train, spa.batch_rows, spa.split_seed + epoch) for epoch in range(1, spa.epochs + 1)}
    total = sum(map(len, plan.values()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=spa.lr, betas=tuple(spa.betas), weight_decay=spa.weight_decay)
    warmup = math.ceil(spa.warmup_fraction * total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, "cosine", warmup, total))
    report_path = root / REPORT
    report = json.loads(report_path.read_text()) if checkpoints and report_path.exists() else {}
    first_epoch = (
        load_trainer_state(checkpoints[-1], {"optimizer": optimizer, "scheduler": scheduler}) + 1 if checkpoints else 1
    )
    print(
        f"[spa sft] {len(records)} episodes -> {len(seqs)} sequences, {sum(s.rows for s in train)} train rows in "
        f"{len(train)} episodes, {sum(s.rows for s in held)} held-out rows in {len(held)}; {spa.epochs} epochs, "
        f"{total} steps at lr {spa.lr:g}" + (f"; resuming after epoch {first_epoch - 1}" if checkpoints else ""),
        flush=True,
    )
    if "before" not in report:
        report = {"before": held_out(model, held), "epochs": [], "model": cfg.model.name}
        print(f"[spa sft] held out before: {report['before']}", flush=True)
    model.train()
    for epoch in range(first_epoch, spa.epochs + 1):
        t0, epoch_tokens, losses = time.monotonic(), 0, []
        steps = plan[epoch]
        for k, batch in enumerate(steps, start=1):
            optimizer.zero_grad()
            n = sum(sum(length for _, length in s.spans) for s in batch)
            total_nll = 0.0
            for seq in batch:  # one sequence per forward: the batch's token mean, accumulated
                logp, _ = _scored(model, seq)
                (-logp.sum() / n).backward()
                total_nll -= float(logp.detach().sum())
            torch.nn.utils.clip_grad_norm_(model.parameters(), spa.max_grad_norm)
            optimizer.step()
            scheduler.step()
            epoch_tokens += sum(len(s.tokens) for s in batch)
            losses.append(total_nll / n)
            elapsed = time.monotonic() - t0
            print(
                f"[spa sft] epoch {epoch}/{spa.epochs} step {k}/{len(steps)} loss {losses[-1]:.3f} "
                f"rows {sum(s.rows for s in batch)} lr {scheduler.get_last_lr()[0]:.2e} "
                f"{epoch_tokens / elapsed:.0f} tok/s ETA {elapsed / k * (len(steps) - k):.0f}s",
                flush=True,
            )
        seconds = time.monotonic() - t0
        after = held_out(model, held)
        report["epochs"].append(
            asdict(EpochReport(epoch, float(np.mean(losses)), seconds, epoch_tokens / seconds, after))
        )
        path = save_checkpoint(
            root / "sft",
            epoch,
            model,
            tokenizer,
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
            keep_last=1,
        )
        report["final_checkpoint"] = str(path)
        report_path.write_text(json.dumps(report, indent=1))
        print(f"[spa sft] epoch {epoch} done in {seconds:.0f}s: held out {after}; checkpoint {path}", flush=True)
    path = Path(report.get("final_checkpoint") or checkpoints[-1])
    print(f"[spa sft] done: {path}. Then RL from it: empo2-run model.name={path} [preset=empo2|grpo ...]", flush=True)
    return path
