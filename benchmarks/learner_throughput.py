"""Learner throughput by packing: one EMPO2 train_step per learner.packing (turn, episode, group) on
the same batch, measured in the same run (ratios are what to compare; the machine is noisy), on the
Trainer's policy as the learner runs it (FSDP2-sharded, a process group of one).

    # real episodes: the complete groups of a run's replay-buffer log
    .venv/bin/python -m benchmarks.learner_throughput --episodes runs/<run>/buffer.log [--groups 1]
    # synthetic turn samples (no chains: every packing is turn packing), with the plain baseline
    .venv/bin/python -m benchmarks.learner_throughput [--samples 8] [--prompt-tokens 350] --plain

Per packing: median wall seconds of a step (after --warmup steps), the tokens its update pass
forwarded (StepStats.forward_tokens), the sequences it scored, and the process's peak resident
memory during its steps (VmHWM, reset before each packing, after the freed heap is given back).
`chain_tokens` is what scoring every chain once costs: the tokens of each segment's last prompt
and response. `--plain` adds the plain baseline: for each turn sample model(input_ids, labels=...)
on the whole sequence (full-vocabulary logits at every position, HF's causal-LM loss), backward,
then one AdamW step for the batch. `graph_mb_per_token` (CPU): the resident memory a training
forward holds for its backward, per token, with autograd's own activations and with lean ones. An
entry `group:4096:full` steps with autograd's own activations instead of learner.lean_activations'
(the default).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from benchmarks.record import command_line, write_result
from common.model_prep import resolve_model
from common.process import release_free_heap, status_mb
from learner.advantages import CountBonus
from learner.config import LearnerConfig, Packing
from learner.lean_activations import lean_activations
from learner.policy_model import load_policy
from learner.samples import TurnSample, build_samples
from learner.step import StepContext, segments, train_step
from learner.train import Trainer
from protocol.messages import ON_POLICY, Trajectory
from replay_buffer.buffer import BufferLog


def synthetic_batch(n: int, prompt_tokens: int, response_tokens: int, vocab: int, seed: int = 0) -> list[TurnSample]:
    rng = np.random.default_rng(seed)
    batch = []
    for i in range(n):
        prompt = rng.integers(0, vocab, prompt_tokens + rng.integers(-50, 50)).astype(np.int32)
        response = rng.integers(0, vocab, response_tokens).astype(np.int32)
        batch.append(
            TurnSample(
                prompt,
                prompt,
                response,
                np.full(response_tokens, -2.0, np.float32),
                float(i % 2) - 0.5,
                ON_POLICY,
                0,
                False,
            )
        )
    return batch


def complete_groups(log: Path, groups: int) -> list[Trajectory]:
    """The trajectories of the `groups` groups of the log with the most turns among those with as
    many episodes as its fullest group (the replay buffer's complete groups)."""
    by_group: dict[str, list[Trajectory]] = defaultdict(list)
    for t in BufferLog.read(log)[0]:
        by_group[t.group_id].append(t)
    size = max(len(ts) for ts in by_group.values())
    complete = [ts for ts in by_group.values() if len(ts) == size]
    complete = sorted(complete, key=lambda ts: -sum(t.num_turns for t in ts))[:groups]
    if len(complete) < groups:
        raise SystemExit(f"{log} has {len(complete)} complete groups of {size}, not {groups}")
    return [t for ts in complete for t in ts]


def plain_step(model, optimizer, batch: list[TurnSample]) -> None:
    optimizer.zero_grad(set_to_none=True)
    for s in batch:
        ids = torch.from_numpy(np.concatenate([s.update_prompt, s.response]).astype(np.int64))[None].to(model.device)
        labels = ids.clone()
        labels[0, : len(s.update_prompt)] = -100
        model(input_ids=ids, labels=labels).loss.backward()
    optimizer.step()


def reset_peak_rss() -> None:
    """Start VmHWM again from the resident memory now (Linux: 5 > /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def graph_mb_per_token(scorer, tokens: int = 1024, repeats: int = 2) -> float:
    """The resident memory a training forward of `tokens` tokens holds for its backward, per token
    (the freed heap given back before and after; the last of `repeats`, the first carries warm-up)."""
    ids = torch.randint(0, scorer.lm.config.vocab_size, (1, tokens), device=scorer.lm.device)
    held = 0.0
    for _ in range(repeats):
        release_free_heap()
        before = status_mb()
        out = scorer(ids, torch.arange(tokens - 16, tokens, device=ids.device))
        release_free_heap()
        held = (status_mb() - before) / tokens
        del out
    return held


def timed(fn, repeats: int, warmup: int, device: str = "cpu") -> tuple[float, object]:
    """(median wall seconds of fn() after `warmup` runs, its last result); on CUDA each run ends when
    its kernels have."""
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    for _ in range(warmup):
        fn()
    times, out = [], None
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=Path, help="a replay-buffer log (runs/<run>/buffer.log); default synthetic")
    parser.add_argument("--groups", type=int, default=1, help="complete groups of the log in the batch")
    parser.add_argument("--samples", type=int, default=8, help="synthetic: turn samples")
    parser.add_argument("--prompt-tokens", type=int, default=350, help="synthetic: prompt length")
    parser.add_argument("--response-tokens", type=int, default=12, help="synthetic: response length")
    parser.add_argument(
        "--packings",
        default="turn,episode,group",
        help="PACKING[:MICRO_BATCH_TOKENS[:lean|full]],...: each its own budget and activations if given "
        "(lean: learner.lean_activations, the default; full: autograd's own)",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--micro-batch-tokens", type=int, default=LearnerConfig.micro_batch_tokens)
    parser.add_argument("--plain", action="store_true", help="also the plain fwd+bwd+step baseline")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="learner.gradient_checkpointing")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="learner.device")
    parser.add_argument("--model", default="embedded:SmolLM2-135M-Instruct", help="model name or HF directory")
    parser.add_argument("--out", default="benchmarks/results/learner_throughput.json")
    return parser.parse_args()


def load_batch(args: argparse.Namespace, cfg: LearnerConfig, trainer: Trainer) -> tuple[list[TurnSample], dict]:
    """The batch every packing steps on (the log's complete groups, or synthetic), and its source."""
    if args.episodes:
        trajectories = complete_groups(args.episodes, args.groups)
        batch = build_samples(trajectories, cfg.score_scale, CountBonus(cfg.intrinsic_coef), cfg.adv_eps)
        return batch, {"episodes": str(args.episodes), "groups": args.groups, "episodes_in_batch": len(trajectories)}
    batch = synthetic_batch(args.samples, args.prompt_tokens, args.response_tokens, trainer.scorer.lm.config.vocab_size)
    return batch, {"synthetic_samples": args.samples, "prompt_tokens": args.prompt_tokens}


def measure(
    args: argparse.Namespace, cfg: LearnerConfig, trainer: Trainer, path: str, batch: list[TurnSample], result: dict
) -> None:
    """A timed step per packing (and the plain baseline with --plain), into `result`."""
    for entry in args.packings.split(","):  # PACKING[:MICRO_BATCH_TOKENS[:lean|full]]
        packing, budget, activations = (entry.split(":") + ["", ""])[:3]
        step_cfg = dataclasses.replace(
            cfg, packing=Packing(packing), micro_batch_tokens=int(budget or cfg.micro_batch_tokens)
        )
        lean = {"": cfg.lean_activations, "lean": True, "full": False}[activations]
        lean_activations(trainer.scorer, lean)
        release_free_heap()  # what the entry before freed goes back: each entry's peak from the same floor
        reset_peak_rss()
        seconds, stats = timed(
            lambda c=step_cfg: train_step(StepContext(trainer.scorer, trainer.optimizer, batch, c, version=0)),
            args.repeats,
            args.warmup,
            args.device,
        )
        result["packing"][entry] = {
            "micro_batch_tokens": step_cfg.micro_batch_tokens,
            "lean_activations": lean,
            "step_seconds": seconds,
            "forward_tokens": stats.forward_tokens,
            "sequences": stats.segments,
            "peak_rss_mb": status_mb(field="VmHWM"),
        }
        print(f"{entry:8} {seconds:8.1f} s/step  {stats.forward_tokens:7d} tokens forwarded", flush=True)
    turn = next((r for e, r in result["packing"].items() if e.split(":")[0] == "turn"), None)  # the baseline
    for r in result["packing"].values():
        r["forward_tokens_per_chain_token"] = r["forward_tokens"] / result["chain_tokens"]
        if turn is not None:
            r["speedup_vs_turn"] = turn["step_seconds"] / r["step_seconds"]
            r["forward_tokens_vs_turn"] = r["forward_tokens"] / turn["forward_tokens"]
    if args.plain:
        model, _ = load_policy(path, trainer.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        plain_s, _ = timed(lambda: plain_step(model, optimizer, batch), args.repeats, args.warmup, args.device)
        result["plain_step_seconds"] = plain_s
        for r in result["packing"].values():
            r["ratio_to_plain"] = plain_s / r["step_seconds"]


def report(args: argparse.Namespace, result: dict) -> None:
    result["load_average_at_end"] = os.getloadavg()[0]
    write_result(args.out, result, indent=1)
    print(f"{'packing':8} {'s/step':>8} {'x turn':>7} {'tokens':>8} {'/chain':>7} {'peak MB':>8}")
    for packing, r in result["packing"].items():
        print(
            f"{packing:8} {r['step_seconds']:8.1f} {r.get('speedup_vs_turn', float('nan')):7.2f} "
            f"{r['forward_tokens']:8d} {r['forward_tokens_per_chain_token']:7.2f} {r['peak_rss_mb']:8.0f}"
        )


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    path = resolve_model(args.model)
    # tiny lr: the weights barely move between the packings; the mask off: every token costs the same
    cfg = LearnerConfig(
        lr=1e-12,
        low_prob_mask="off",
        device=args.device,
        micro_batch_tokens=args.micro_batch_tokens,
        gradient_checkpointing=args.gradient_checkpointing,  # not passed before 2026-12-06: it did nothing
    )
    trainer = Trainer(cfg, path, seed=0)
    batch, source = load_batch(args, cfg, trainer)
    chains = segments(batch, Packing.episode)
    result = {
        "command": command_line([".venv/bin/python", "-m", "benchmarks.learner_throughput"], sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **source,
        "turn_samples": len(batch),
        "response_tokens": int(sum(len(s.response) for s in batch)),
        "turn_tokens": int(sum(len(s.update_prompt) + len(s.response) for s in batch)),
        "chain_tokens": int(sum(len(batch[seg[-1]].update_prompt) + len(batch[seg[-1]].response) for seg in chains)),
        "chains": len(chains),
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "micro_batch_tokens": args.micro_batch_tokens,
        "gradient_checkpointing": args.gradient_checkpointing,
        "packing": {},
    }
    print(
        f"{len(batch)} turn samples in {len(chains)} chains: {result['turn_tokens']} tokens as turns, "
        f"{result['chain_tokens']} as chains, {torch.get_num_threads()} threads",
        flush=True,
    )
    if args.device == "cpu":  # what each activations setting holds per token (resident memory)
        result["graph_mb_per_token"] = {}
        for lean in (False, True):
            lean_activations(trainer.scorer, lean)
            result["graph_mb_per_token"]["lean" if lean else "full"] = round(graph_mb_per_token(trainer.scorer), 3)
        print(f"held for the backward, MB per token: {result['graph_mb_per_token']}", flush=True)
    measure(args, cfg, trainer, path, batch, result)
    report(args, result)


if __name__ == "__main__":
    main()
