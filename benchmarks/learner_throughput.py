"""Learner throughput: the EMPO2 train_step against a plain forward+backward+step of the same
model on the same batch, measured in the same run (ratios are what to compare; the machine is
noisy). Tokens counted = prompt + response tokens processed by the forward pass.

    .venv/bin/python -m benchmarks.learner_throughput [--samples 8] [--prompt-tokens 350] [--repeats 3]
        [--micro-batch-tokens 4096] [--device cpu|cuda] [--model embedded:SmolLM2-135M-Instruct | HF dir]

Learner: train_step on the Trainer's policy as the learner runs it (FSDP2-sharded, a process
group of one), and on an unsharded copy (what sharding costs at world size 1).
Baseline: for each sample, model(input_ids, labels=...) on the whole sequence (full-vocabulary
logits at every position, HF's causal-LM loss), backward, then one AdamW step for the batch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

from benchmarks.record import command_line, status_mb, write_result
from common.model_prep import resolve_model
from learner.config import LearnerConfig
from learner.policy_model import load_policy
from learner.samples import TurnSample
from learner.step import train_step
from learner.train import Trainer
from protocol.messages import ON_POLICY


def make_batch(n: int, prompt_tokens: int, response_tokens: int, vocab: int, seed: int = 0) -> list[TurnSample]:
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


def plain_step(model, optimizer, batch: list[TurnSample]) -> None:
    optimizer.zero_grad(set_to_none=True)
    for s in batch:
        ids = torch.from_numpy(np.concatenate([s.update_prompt, s.response]).astype(np.int64))[None].to(model.device)
        labels = ids.clone()
        labels[0, : len(s.update_prompt)] = -100
        model(input_ids=ids, labels=labels).loss.backward()
    optimizer.step()


def timed(fn, repeats: int, device: str = "cpu") -> float:
    """Median wall seconds of fn() after one warm-up; on CUDA each run ends when its kernels have."""
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=350)
    parser.add_argument("--response-tokens", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--micro-batch-tokens", type=int, default=LearnerConfig.micro_batch_tokens)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="learner.device of both sides")
    parser.add_argument("--model", default="embedded:SmolLM2-135M-Instruct", help="model name or HF directory")
    parser.add_argument("--out", default="benchmarks/results/learner_throughput.json")
    args = parser.parse_args()

    path = resolve_model(args.model)
    # tiny lr: the weights barely move
    cfg = LearnerConfig(
        lr=1e-12, low_prob_threshold=None, device=args.device, micro_batch_tokens=args.micro_batch_tokens
    )
    trainer = Trainer(cfg, path, seed=0)
    model, _ = load_policy(path, trainer.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    batch = make_batch(args.samples, args.prompt_tokens, args.response_tokens, model.config.vocab_size)
    tokens = sum(len(s.update_prompt) + len(s.response) for s in batch)

    learner_s = timed(
        lambda: train_step(trainer.scorer, trainer.optimizer, batch, cfg, version=0), args.repeats, args.device
    )
    learner_peak_rss_mb = status_mb(field="VmHWM")  # the process's high-water mark once the learner's steps have run
    unsharded_s = timed(lambda: train_step(model, optimizer, batch, cfg, version=0), args.repeats, args.device)
    plain_s = timed(lambda: plain_step(model, optimizer, batch), args.repeats, args.device)
    result = {
        "command": command_line([".venv/bin/python", "-m", "benchmarks.learner_throughput"], sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average_at_end": os.getloadavg()[0],
        "samples": args.samples,
        "tokens_per_step": tokens,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "micro_batch_tokens": args.micro_batch_tokens,
        "learner_tokens_per_s": tokens / learner_s,
        "learner_peak_rss_mb": learner_peak_rss_mb,
        "learner_unsharded_tokens_per_s": tokens / unsharded_s,
        "plain_tokens_per_s": tokens / plain_s,
        "ratio_learner_to_plain": plain_s / learner_s,
        "ratio_unsharded_to_plain": plain_s / unsharded_s,
    }
    write_result(args.out, result, indent=1)
    print(f"{'':24}{'tokens/s':>12}")
    print(
        f"{'EMPO2 train_step (FSDP)':24}{result['learner_tokens_per_s']:12.1f}  peak RSS {learner_peak_rss_mb:.0f} MB"
    )
    print(f"{'  same, unsharded':24}{result['learner_unsharded_tokens_per_s']:12.1f}")
    print(f"{'plain fwd+bwd+step':24}{result['plain_tokens_per_s']:12.1f}")
    print(
        f"ratio learner / plain: {result['ratio_learner_to_plain']:.2f}  ({tokens} tokens per step, {torch.get_num_threads()} threads)"
    )


if __name__ == "__main__":
    main()
