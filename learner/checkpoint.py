"""Learner checkpoints: an HF directory (loadable by vLLM and transformers) beside the trainer state
(optimizer, learning-rate schedule, RND bonus if any, policy version, RNG), written atomically, with a retention policy, and resumed so
that the next step is exactly the step an uninterrupted run would have taken.

    <run_dir>/checkpoints/step_000042/model/{model.safetensors, config.json, tokenizer*}   the policy (LoRA merged)
    <run_dir>/checkpoints/step_000042/trainer_state.pt                                      what resuming needs besides

The model directory is a clean HF directory: copy it anywhere (or `empo2-export`, learner/export.py).
Runs written before kept both in one directory (step_000042/{model.safetensors, ..., trainer_state.pt});
model_dir reads either, so they still resume and evaluate.

The replay buffer's position needs no saving here: the buffer's own log records which groups
were served (replay_buffer/service.py).
"""

from __future__ import annotations

import logging
import random
import shutil
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)
_STATE = "trainer_state.pt"
_MODEL = "model"


def model_dir(path: Path | str) -> Path:
    """The HF model directory of a checkpoint: <step_N>/model, or <step_N> itself in the older layout
    (weights and trainer state in one directory); any other directory (an HF model) is itself."""
    path = Path(path)
    return path / _MODEL if (path / _MODEL / "config.json").exists() else path


def save_checkpoint(
    root: Path,
    version: int,
    model,
    tokenizer,
    states: dict[str, dict],
    keep_last: int,
    weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """states: name -> state dict (optimizer, scheduler, ...), loaded back into the objects of the
    same names by load_trainer_state. weights: the full HF-named state dict (gathered from the
    ranks, learner/distributed.py); None = the model's own."""
    path = root / f"step_{version:06d}"
    tmp = root / f".tmp_step_{version:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / _MODEL, state_dict=weights, safe_serialization=True)
    tokenizer.save_pretrained(tmp / _MODEL)
    torch.save(
        {
            "version": version,
            "stateful": states,
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        },
        tmp / _STATE,
    )
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)  # a checkpoint directory is complete or absent
    for old in list_checkpoints(root)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old)  # the model directory and the trainer state together
    log.info("checkpoint saved: %s", path)
    return path


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not root.exists():
        return []
    return sorted(p for p in root.glob("step_*") if (p / _STATE).exists())


def load_trainer_state(path: Path, stateful: dict) -> int:
    """Restore the objects saved under the same names (optimizer, schedule, ...) and the RNG from a
    checkpoint (the model is loaded from model_dir(path)); returns the checkpoint's policy version."""
    state = torch.load(path / _STATE, weights_only=False)  # our own file, written by save_checkpoint
    for name, obj in stateful.items():
        obj.load_state_dict(state["stateful"][name])
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    return int(state["version"])
