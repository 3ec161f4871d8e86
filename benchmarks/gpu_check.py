"""The learner's CUDA paths, run for real: the Trainer (FSDP2) on nccl as a plain process (a group of
one) and under `torchrun --nproc_per_node=1`, one EMPO2 train step on the SmolLM2-135M architecture
(random weights from its config.json, seed 0) compared with the same step on the CPU (fp32, no TF32),
a checkpoint written and resumed on CUDA, and the learner throughput benchmark on the GPU.

    python3 -m benchmarks.gpu_check --config-dir DIR [--out DIR] [--accel cuda|cpu] [--tiny]

DIR holds the model's config.json and tokenizer files (not its weights). `--accel cpu --tiny` is a
dry run of the whole flow on a CPU (gloo, a 2-layer model of the same vocabulary). Each run is a
process of its own (`worker`): the CPU reference (gloo), the accelerator as a plain process and under
torchrun. Every worker takes the same two batches through Trainer.step (build_samples, train_step:
micro-batched, 2 mini-batches, decoupled PPO, KL reference, entropy, the tip_rollouts mask), from the
same saved initial weights; the first optimizer step's gradients (before clipping), the gradient norms
and the weights after the step are compared. Prints a table; writes `<out>/gpu_check.json` and the
workers' logs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.record import command_line

REPO = Path(__file__).resolve().parent.parent
LR = 1e-5
# Relative tolerances, CPU (fp32) against CUDA (fp32, TF32 off). fp32 rounds at u = 6e-8; the longest
# reductions (K = 576..1536 in the matmuls, 49152 in the log-softmax, a few hundred positions in attention)
# err by ~sqrt(K)·u <= 1.3e-5 when summed in another order, as cuBLAS and the CPU kernels do.
TOL = {
    # forward only: logp ~ -11 with ~1e-5 absolute error -> ratio r = exp(logp - b) within ~1e-5; the
    # token mean over ~1.5k tokens does not grow it; 10x slack
    "loss": 1e-4,
    "stats": 1e-4,  # ratio, entropy: token means of forward quantities, as the loss
    # backward through 30 decoder layers: ~60 residual sublayers adding their errors (x8 in quadrature)
    # -> ~1e-4; 10x slack. The norm is a sum of squares of the same gradients
    "grad": 1e-3,
    "grad_norm": 1e-3,
    # AdamW's first steps move every weight by ~lr·sign(g): an element whose gradient lies within rounding
    # noise of zero may step the other way, each such flip costing (2·lr)² of the update's ||Δ||² ≈ N·lr².
    # 5e-2 allows flips in 0.06% of the elements; a wrong gradient or state moves it by O(1)
    "update": 5e-2,
    # resumed step against the uninterrupted one on the same device: exact where the kernels are
    # deterministic (the CPU test's atol 0); a lost optimizer or schedule state moves it by O(1)
    "resume": 1e-3,
    # approx_kl, kl_mean: means of (differences of) log-prob gaps of ~1e-2..1: the ~1e-5 error of each
    # log-prob is relative to the gap, not to the log-prob; and step 1's weights already differ (update)
    "divergence": 5e-2,
}


def _log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------- model


def build_model(config_dir: Path, out: Path, tiny: bool, seed: int = 0) -> dict:
    """The architecture of config_dir/config.json with random weights (torch seed `seed`), saved as
    an HF directory with the tokenizer: the one initial state every worker loads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(config_dir)
    if tiny:  # the dry run: 2 narrow layers, the same vocabulary and tied embeddings
        config.update(
            dict(
                num_hidden_layers=2,
                hidden_size=64,
                intermediate_size=128,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
            )
        )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).float()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(config_dir).save_pretrained(out)
    return {
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "tiny": tiny,
        "seed": seed,
    }


def group(step: int, vocab: int) -> list:
    """One GRPO group shaped as the tests' mixed groups (testing/factories.py), each turn its own chain
    (4 episodes of 2 turns: on-policy, on-policy with tips, off-policy, on-policy; tips at prompt
    tokens 1..3; scores 0/25/50/75; versions = step), with prompts of 100-300 and responses of 8-24
    tokens over the model's vocabulary, and behaviour log-probs near a random-init model's (about
    -log V), so that ratios fall on both sides of the clip."""
    from protocol.messages import OFF_POLICY, ON_POLICY, ON_POLICY_TIPS
    from testing.factories import Turn, trajectory

    rng = np.random.default_rng(1000 + step)
    centre = -math.log(vocab)
    out = []
    for slot, mode in enumerate((ON_POLICY, ON_POLICY_TIPS, OFF_POLICY, ON_POLICY)):
        turns, memories, observations = [], [1, 3], ["a room", f"room {slot}"]
        for _ in observations:
            response = rng.integers(3, vocab, rng.integers(8, 25))
            prompt = rng.integers(3, vocab, rng.integers(100, 301))
            logprobs = centre + rng.uniform(-0.6, 0.4, len(response))
            turns.append(Turn(prompt, response, logprobs, [(1, 3)] if mode != ON_POLICY else []))
        traj = trajectory(
            turns, mode=mode, score=25.0 * slot, group_id=f"g{step}", slot=slot, episode_id=f"{step}-{slot}",
            task="t", versions=[step] * 2, num_memories=memories, observations=observations, actions=["look", "go"],
        )  # fmt: skip
        out.append(traj)
    return out


def learner_config(device: str, vocab: int):
    from learner.config import LearnerConfig

    return LearnerConfig(
        lr=LR,
        total_steps=4,
        lr_schedule="linear",
        mini_batch_samples=4,  # 8 turn samples per batch: 2 optimizer steps
        micro_batch_tokens=512,  # several micro-batches per mini-batch
        ratio="decoupled",  # the proximal pre-scoring pass (several mini-batches)
        kl_coef=0.05,  # the frozen, sharded KL reference and its pass
        entropy_coef=0.01,
        low_prob_mask="tip_rollouts",  # the tip-free pre-scoring pass; every tip sample is masked:
        low_prob_threshold=-math.log(vocab) + 3.0,  # a random-init model's log-probs lie near -log V
        device=device,
    )


# --------------------------------------------------------------------------------------------- worker


def worker(args: argparse.Namespace) -> None:
    """One run: Trainer.step on batch 0 (gradients and norms recorded), weights saved; with --resume a
    checkpoint, step on batch 1, then a fresh Trainer resumed from the checkpoint takes batch 1 again."""
    import torch
    from safetensors.torch import save_file

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_float32_matmul_precision("highest")  # fp32 matmuls, no TF32
    torch.backends.cudnn.allow_tf32 = False

    from learner import distributed
    from learner.train import Trainer
    from protocol.messages import Batch

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    cfg = learner_config(args.device, vocab)

    # the project's clip_grad_norm_ call (learner/step.py optimizer_step), recorded: its norm, and at the
    # first optimizer step the token-mean gradients it is given (before clipping)
    norms: list[float] = []
    first_grads: dict[str, torch.Tensor] = {}
    names: dict[int, str] = {}
    clip = torch.nn.utils.clip_grad_norm_

    def full(t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor() if hasattr(t, "full_tensor") else t  # FSDP2: DTensor shards

    def recording_clip(parameters, *a, **k):
        parameters = list(parameters)
        if not norms:
            for p in parameters:
                if p.grad is not None:
                    first_grads[names[id(p)]] = full(p.grad).detach().float().cpu().clone()
        norm = clip(parameters, *a, **k)
        norms.append(float(full(norm)))
        return norm

    torch.nn.utils.clip_grad_norm_ = recording_clip

    t0 = time.perf_counter()
    trainer = Trainer(cfg, args.model, seed=0)
    names.update({id(p): n for n, p in trainer.scorer.named_parameters()})
    is_cuda = trainer.device.type == "cuda"
    sync = torch.cuda.synchronize if is_cuda else lambda: None
    first_param = next(trainer.scorer.parameters())
    result: dict = {
        "device": str(trainer.device),
        "launcher": "torchrun" if "RANK" in os.environ else "plain process",
        "backend": distributed.dist.get_backend(),
        "world_size": distributed.world_size(),
        "fsdp2_dtensor_params": type(first_param).__name__ == "DTensor",
        "param_device": str(first_param.device),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "init_s": time.perf_counter() - t0,
    }
    if is_cuda:
        result |= {
            "gpu": torch.cuda.get_device_name(),
            "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, v)) if isinstance(v := torch.cuda.nccl.version(), tuple) else str(v),
        }
    rank0 = distributed.rank() == 0
    # the batches reach the ranks as the learner sends them: msgpack frames broadcast from rank 0
    batches = [distributed.broadcast_message(Batch(group(k, vocab), 0) if rank0 else None) for k in range(2)]

    sync()
    t0 = time.perf_counter()
    stats = trainer.step(batches[0].trajectories)
    sync()
    result["step_s"] = time.perf_counter() - t0
    result["stats"] = vars(stats)
    result["grad_norms"] = list(norms)
    weights = {k: v.clone() for k, v in trainer.full_weights().items()}  # on CPU it aliases the parameters
    if rank0:
        save_file(weights, str(work / "step1.safetensors"))
        save_file(first_grads, str(work / "grads.safetensors"))
    if is_cuda:
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30

    if args.resume_kl:
        # with the KL reference (as stepped above): the resumed trainer keeps the initial policy as reference
        result["resume_kl"] = resume_check(trainer, cfg, batches, work / "checkpoints_kl", weights, args.model)
    if args.resume:
        del trainer
        # without it: the exact-resume check (tests/integration/test_learner_fsdp.py's, on this device)
        plain_cfg = dataclasses.replace(cfg, kl_coef=0.0)
        trainer = Trainer(plain_cfg, args.model, seed=0)
        trainer.step(batches[0].trajectories)
        weights = {k: v.clone() for k, v in trainer.full_weights().items()}
        result["resume"] = resume_check(trainer, plain_cfg, batches, work / "checkpoints", weights, args.model)
    (work / "result.json").write_text(json.dumps(result, indent=1, default=str))
    distributed.close()


def resume_check(trainer, cfg, batches, root: Path, weights: dict, initial: str) -> dict | None:
    """`trainer` has taken batch 0 (its weights then: `weights`): checkpoint, step on batch 1; a new
    Trainer resumed from the checkpoint takes batch 1 again. Rank 0 gets how far its weights land from
    the uninterrupted step's, relative to that step's update. `initial`: the run's starting weights,
    the KL reference of the resumed trainer (as the learner passes its base model)."""
    import torch

    from learner import distributed
    from learner.train import Trainer

    t0 = time.perf_counter()
    checkpoint = trainer.save_checkpoint(root, keep_last=1)
    checkpoint_s = time.perf_counter() - t0
    stats = trainer.step(batches[1].trajectories)
    final = {k: v.clone() for k, v in trainer.full_weights().items()}
    resume_from = sorted(root.glob("step_*"))[-1]  # written by rank 0, read by every rank
    assert checkpoint is None or checkpoint == resume_from, (checkpoint, resume_from)
    t0 = time.perf_counter()
    resumed = Trainer(cfg, str(resume_from), seed=0, resume_from=resume_from, reference_path=initial)
    load_s = time.perf_counter() - t0
    stats_resumed = resumed.step(batches[1].trajectories)
    again = resumed.full_weights()
    del resumed
    if distributed.rank() != 0:
        return None
    update = sum(float((final[k] - weights[k]).double().pow(2).sum()) for k in final) ** 0.5
    gap = sum(float((again[k] - final[k]).double().pow(2).sum()) for k in final) ** 0.5
    return {
        "checkpoint": resume_from.name,
        "checkpoint_s": checkpoint_s,
        "resume_load_s": load_s,
        "version_resumed": int(resume_from.name.split("_")[1]),
        "bitwise_equal": all(torch.equal(again[k], final[k]) for k in final),
        "max_abs_diff": max(float((again[k] - final[k]).abs().max()) for k in final),
        "rel_to_step2_update": gap / max(update, 1e-30),
        "loss": stats.loss,
        "loss_resumed": stats_resumed.loss,
    }


# ----------------------------------------------------------------------------------------- comparison


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def compare(ref_dir: Path, run_dir: Path, model_dir: Path) -> dict:
    """Run against the reference: loss, stats, gradient norms, first-step gradients, updated weights."""
    import torch
    from safetensors.torch import load_file

    ref, run = (json.loads((d / "result.json").read_text()) for d in (ref_dir, run_dir))
    out: dict = {"loss": (ref["stats"]["loss"], run["stats"]["loss"])}
    for key in ("ratio_mean", "entropy_mean", "approx_kl", "kl_mean", "behaviour_weight_mean", "clip_fraction"):
        out[key] = (ref["stats"][key], run["stats"][key])
    out["tokens"] = ref["stats"]["tokens"]
    out["counts_equal"] = all(
        ref["stats"][k] == run["stats"][k] for k in ("tokens", "samples_masked", "optimizer_steps", "samples")
    )
    out["grad_norms"] = list(zip(ref["grad_norms"], run["grad_norms"]))

    g_ref, g_run = (load_file(str(d / "grads.safetensors")) for d in (ref_dir, run_dir))
    assert g_ref.keys() == g_run.keys()
    num = sum(float((g_run[k].double() - g_ref[k].double()).pow(2).sum()) for k in g_ref)
    den = sum(float(g_ref[k].double().pow(2).sum()) for k in g_ref)
    per_tensor = {
        k: float((g_run[k] - g_ref[k]).norm() / g_ref[k].norm().clamp_min(1e-30))
        for k in g_ref
        if float(g_ref[k].norm())
    }
    worst = max(per_tensor, key=per_tensor.get)
    out["grad_rel_l2"] = (num / den) ** 0.5
    out["grad_worst_tensor"] = (worst, per_tensor[worst])

    w0 = {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    w_ref, w_run = (load_file(str(d / "step1.safetensors")) for d in (ref_dir, run_dir))
    keys = [k for k in w0 if k in w_ref]
    d_ref = {k: w_ref[k].double() - w0[k].double() for k in keys}
    d_run = {k: w_run[k].double() - w0[k].double() for k in keys}
    num = sum(float((d_run[k] - d_ref[k]).pow(2).sum()) for k in keys)
    den = sum(float(d_ref[k].pow(2).sum()) for k in keys)
    dot = sum(float((d_run[k] * d_ref[k]).sum()) for k in keys)
    den_run = sum(float(d_run[k].pow(2).sum()) for k in keys)
    flipped = sum(int(((d_run[k] - d_ref[k]).abs() > LR).sum()) for k in keys)
    elements = sum(w0[k].numel() for k in keys)
    out["update_rel_l2"] = (num / den) ** 0.5
    out["update_cosine"] = dot / (den * den_run) ** 0.5
    out["update_flipped_fraction"] = flipped / elements  # elements whose update differs by more than lr
    out["weights_max_abs_diff"] = max(float((w_run[k] - w_ref[k]).abs().max()) for k in keys)
    out["update_rms"] = (den / elements) ** 0.5
    out["bitwise_equal_weights"] = all(torch.equal(w_run[k], w_ref[k]) for k in keys)
    return out


def checks(name: str, c: dict) -> list[dict]:
    """Table rows: (check, reference, run, relative difference, tolerance, pass)."""
    rows = []

    def row(check, ref, run, rel, tol):
        rows.append(
            {"run": name, "check": check, "ref": ref, "value": run, "rel": rel, "tol": tol, "pass": bool(rel <= tol)}
        )

    row("loss", *c["loss"], _rel(*reversed(c["loss"])), TOL["loss"])
    for key in ("ratio_mean", "entropy_mean", "behaviour_weight_mean"):
        row(key, *c[key], _rel(*reversed(c[key])), TOL["stats"])
    for key in ("approx_kl", "kl_mean"):  # means of log-prob differences: their error is relative to a small gap
        ref, run = c[key]
        row(key, ref, run, abs(run - ref) / max(abs(ref), 1e-6), TOL["divergence"])
    ref, run = c["clip_fraction"]  # a fraction of tokens: one token on the other side of the clip bound allowed
    row("clip_fraction (|diff| x tokens)", ref, run, abs(run - ref) * c["tokens"], 1.01)
    rows.append(
        {
            "run": name,
            "check": "counts (tokens, masked, steps)",
            "ref": "",
            "value": "",
            "rel": 0.0 if c["counts_equal"] else 1.0,
            "tol": 0.0,
            "pass": c["counts_equal"],
        }
    )
    for i, (ref, run) in enumerate(c["grad_norms"]):
        row(f"grad norm, optimizer step {i + 1}", ref, run, _rel(run, ref), TOL["grad_norm"])
    row("gradient (step 1, rel L2)", "", "", c["grad_rel_l2"], TOL["grad"])
    row("updated weights (Δ rel L2)", "", "", c["update_rel_l2"], TOL["update"])
    return rows


def throughput(args, model_dir: Path, work: Path, label: str, extra: list[str]) -> dict:
    out = work / f"throughput_{label}.json"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.learner_throughput",
        "--device",
        args.accel,
        "--model",
        str(model_dir),
        "--out",
        str(out),
        "--plain",
        *extra,
    ]
    _run(cmd, Path(args.out) / f"throughput_{label}.log", timeout=300)
    return {"args": extra, **json.loads(out.read_text())}


# ------------------------------------------------------------------------------------------- launcher


def _env() -> dict:
    return dict(
        os.environ,
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )


def _start(cmd: list[str], log: Path) -> subprocess.Popen:
    _log(" ".join(cmd[1:]))
    return subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def _wait(proc: subprocess.Popen, log: Path, timeout: float) -> None:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = "timeout"
    if rc != 0:
        print(log.read_text(errors="replace")[-6000:], flush=True)
        raise RuntimeError(f"{log.name}: exit {rc}")


def _run(cmd: list[str], log: Path, timeout: float) -> None:
    _wait(_start(cmd, log), log, timeout)


def _worker_cmd(device: str, model: Path, work: Path, resume: bool, threads: int, resume_kl: bool = False) -> list[str]:
    return [
        "-m",
        "benchmarks.gpu_check",
        "worker",
        "--device",
        device,
        "--model",
        str(model),
        "--work",
        str(work),
        "--threads",
        str(threads),
        *(["--resume"] if resume else []),
        *(["--resume-kl"] if resume_kl else []),
    ]


def run_workers(args: argparse.Namespace, model_dir: Path, work: Path, out: Path) -> tuple[dict[str, Path], dict]:
    """The two steps on the CPU reference, beside them on the accelerator in one process ("plain")
    and under torchrun; the accelerator runs' directories and the failures among them."""
    cpus = os.cpu_count() or 2
    cpu_threads = max(1, cpus - 4)  # the CPU reference runs beside the accelerator runs
    # the GPU stays visible to the CPU reference: learner.device=cpu must keep its parameters on the CPU
    # (FSDP2's default mesh had moved them to the GPU: the placement row checks it)
    ref = _start([sys.executable, *_worker_cmd("cpu", model_dir, work / "cpu", False, cpu_threads)], out / "cpu.log")
    runs = {"plain": work / "plain", "torchrun": work / "torchrun"}
    failures: dict[str, str] = {}
    try:
        _run(
            [sys.executable, *_worker_cmd(args.accel, model_dir, runs["plain"], True, 2, resume_kl=True)],
            out / "plain.log",
            timeout=args.worker_timeout,
        )
    except RuntimeError as exc:
        failures["plain"] = str(exc)
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        _run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node=1",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                *_worker_cmd(args.accel, model_dir, runs["torchrun"], True, 2),
            ],
            out / "torchrun.log",
            timeout=args.worker_timeout,
        )
    except RuntimeError as exc:
        failures["torchrun"] = str(exc)
    _wait(ref, out / "cpu.log", timeout=args.worker_timeout)
    return runs, failures


def judge(args: argparse.Namespace, report: dict, runs: dict[str, Path], work: Path, model_dir: Path) -> list[dict]:
    """Each run's results into `report`, and the check rows: placement, each accelerator run
    against the CPU reference, the resumes, plain against torchrun."""
    failures = report["failures"]
    rows = []
    report["runs"] = {"cpu": json.loads((work / "cpu" / "result.json").read_text())}
    rows.append(_placement_row("cpu", report["runs"]["cpu"], "cpu"))
    for name, d in runs.items():
        if name in failures:
            continue
        report["runs"][name] = json.loads((d / "result.json").read_text())
        rows.append(_placement_row(name, report["runs"][name], args.accel))
        comparison = compare(work / "cpu", d, model_dir)
        report[f"compare_cpu_{name}"] = comparison
        rows += checks(f"cpu vs {name}", comparison)
        for key, check in (
            ("resume", "resume, kl_coef=0 (Δw rel to step-2 update)"),
            ("resume_kl", "resume, kl_coef>0 (Δw rel to step-2 update)"),
        ):
            res = report["runs"][name].get(key)
            if res:
                rows.append(
                    {
                        "run": name,
                        "check": check,
                        "ref": res["loss"],
                        "value": res["loss_resumed"],
                        "rel": res["rel_to_step2_update"],
                        "tol": TOL["resume"],
                        "pass": bool(res["rel_to_step2_update"] <= TOL["resume"]),
                        "bitwise": res["bitwise_equal"],
                    }
                )
    if not failures:
        c = compare(runs["plain"], runs["torchrun"], model_dir)
        report["compare_plain_torchrun"] = c
        rows += checks("plain vs torchrun", c)
    return rows


def measure_throughput(
    args: argparse.Namespace, report: dict, model_dir: Path, work: Path, started: float, save: Callable[[], None]
) -> None:
    """learner_throughput on the accelerator per batch size, while --budget-s lasts, into `report`."""
    report["throughput"] = {}
    configs = {"default": [], "large": ["--samples", "32", "--prompt-tokens", "1000", "--response-tokens", "32"]}
    if args.tiny:
        configs = {"default": ["--samples", "2", "--prompt-tokens", "60", "--repeats", "1"]}
    for label, extra in configs.items():
        if time.perf_counter() - started > args.budget_s:
            report["throughput"][label] = "skipped: over --budget-s"
            continue
        try:
            report["throughput"][label] = throughput(args, model_dir, work, label, extra)
        except (RuntimeError, OSError, ValueError) as exc:
            report["throughput"][label] = f"failed: {exc}"
        save()


def main_run(args: argparse.Namespace) -> None:
    import torch

    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if args.accel == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--accel cuda: torch sees no CUDA device")
    report: dict = {
        # the device tool's output folder is named by its variable, paths in the repository relative to it
        "command": command_line(
            ["python3", "-m", "benchmarks.gpu_check"],
            ["$OUT" if a == os.environ.get("OUT") else a for a in sys.argv[1:]],
        ),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "accel": args.accel,
        "tolerances": TOL,
        "lr": LR,
    }
    result_path = out / "gpu_check.json"

    def save():
        report["wall_s"] = time.perf_counter() - started
        result_path.write_text(json.dumps(report, indent=1, default=str) + "\n")

    model_dir = work / "model"
    report["model"] = build_model(Path(args.config_dir), model_dir, args.tiny)
    _log(f"model: {report['model']}")
    save()
    runs, report["failures"] = run_workers(args, model_dir, work, out)
    report["checks"] = rows = judge(args, report, runs, work, model_dir)
    judged = [r for r in rows if r["tol"] is not None]
    report["passed"] = f"{sum(r['pass'] for r in judged)}/{len(judged)}"
    save()
    measure_throughput(args, report, model_dir, work, started, save)
    save()
    print_table(report)
    _log(f"wrote {result_path} ({report['wall_s']:.0f} s)")


def _placement_row(name: str, run: dict, device: str) -> dict:
    """The run's parameters are where learner.device put them (the comparison means nothing otherwise)."""
    ok = run["param_device"].split(":")[0] == device and run["device"].split(":")[0] == device
    return {
        "run": name,
        "check": "parameters on learner.device",
        "ref": device,
        "value": run["param_device"],
        "rel": 0.0 if ok else 1.0,
        "tol": 0.0,
        "pass": ok,
    }


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _fmt_tol(tol) -> str:
    return "-" if tol is None else f"{tol:.0e}"


def print_table(report: dict) -> None:
    print()
    runs = report.get("runs", {})
    for name, r in runs.items():
        print(
            f"{name:9} {r['device']:7} {r['launcher']:14} backend={r['backend']} world={r['world_size']} "
            f"fsdp2={r['fsdp2_dtensor_params']} step={r['step_s']:.2f}s {r.get('gpu', '')}"
        )
    for name, msg in report.get("failures", {}).items():
        print(f"{name}: FAILED: {msg}")
    print()
    print(f"{'run':18} {'check':44} {'reference':>13} {'value':>13} {'rel diff':>10} {'tol':>8}  result")
    for r in report.get("checks", []):
        verdict = "info" if r["tol"] is None else "pass" if r["pass"] else "FAIL"
        if "bitwise" in r:
            verdict += " (bitwise)" if r["bitwise"] else " (not bitwise)"
        print(
            f"{r['run']:18} {r['check']:44} {_fmt(r['ref']):>13} {_fmt(r['value']):>13} {r['rel']:10.2e} "
            f"{_fmt_tol(r['tol']):>8}  {verdict}"
        )
    for name in ("compare_cpu_plain", "compare_cpu_torchrun", "compare_plain_torchrun"):
        c = report.get(name)
        if c:
            print(
                f"{name}: update cosine {c['update_cosine']:.6f}, flipped {c['update_flipped_fraction']:.2e}, "
                f"update rms {c['update_rms']:.2e}, max |Δw| {c['weights_max_abs_diff']:.2e}, "
                f"bitwise {c['bitwise_equal_weights']}, worst gradient tensor {c['grad_worst_tensor'][0]} "
                f"{c['grad_worst_tensor'][1]:.2e}"
            )
    print(f"checks passed: {report.get('passed')}")
    print()
    for label, t in report.get("throughput", {}).items():
        if isinstance(t, str):
            print(f"throughput {label}: {t}")
            continue
        packings = ", ".join(
            f"{p} {r['step_seconds']:.2f} s (plain/learner {r['ratio_to_plain']:.2f})" for p, r in t["packing"].items()
        )
        print(
            f"throughput {label} ({t['turn_samples']} samples, {t['turn_tokens']} tokens/step, {t['device']}): "
            f"plain {t['plain_step_seconds']:.2f} s; {packings}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--device", required=True)
    w.add_argument("--model", required=True)
    w.add_argument("--work", required=True)
    w.add_argument("--threads", type=int, default=0)
    w.add_argument("--resume", action="store_true")
    w.add_argument("--resume-kl", action="store_true")
    parser.add_argument("--config-dir", default=".gpu/SmolLM2-135M-Instruct")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/empo2_gpu_check_out"))
    parser.add_argument("--work", default="/tmp/empo2_gpu_check")
    parser.add_argument("--accel", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of the same vocabulary (dry run)")
    parser.add_argument("--budget-s", type=float, default=240.0, help="no throughput run starts after this")
    parser.add_argument("--worker-timeout", type=float, default=240.0)
    args = parser.parse_args()
    if args.cmd == "worker":
        worker(args)
    else:
        main_run(args)


if __name__ == "__main__":
    main()
