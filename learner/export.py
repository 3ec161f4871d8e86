"""empo2-export CHECKPOINT OUT: a learner checkpoint as a clean Hugging Face model directory, to take
elsewhere (transformers' AutoModelForCausalLM.from_pretrained(OUT), vLLM, the Hub).

CHECKPOINT: a checkpoint directory (<run_dir>/checkpoints/step_000042, either layout:
learner/checkpoint.py), a run directory or its checkpoints/ directory (then the newest complete
checkpoint). OUT: a new or empty directory. It gets the model's files (config.json,
model.safetensors, the tokenizer's files), never the trainer state (optimizer moments, RNG: only
resuming needs them). A LoRA run's checkpoints already hold the merged policy W0 + scale * B @ A
(Trainer.save_checkpoint), so OUT is a plain model either way. Written to OUT.tmp first, then renamed.

Run: empo2-export runs/<date-time> exported/  (or python -m learner.export ...)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

_STATE = "trainer_state.pt"  # learner/checkpoint.py's; not imported here: --help without torch


def find_checkpoint(source: Path) -> Path:
    """The checkpoint `source` names: itself, or the newest complete one under a run directory or its checkpoints/."""
    if (source / _STATE).exists():
        return source
    from learner.checkpoint import list_checkpoints

    for root in (source / "checkpoints", source):
        found = list_checkpoints(root)
        if found:
            return found[-1]
    raise ValueError(f"{source}: not a checkpoint (no {_STATE}), and no complete checkpoint under it")


def export_checkpoint(source: Path | str, out: Path | str) -> Path:
    """Copy the model directory of the checkpoint `source` names to `out` (a new or empty directory); returns `out`."""
    from learner.checkpoint import model_dir

    checkpoint, out = find_checkpoint(Path(source)), Path(out)
    model = model_dir(checkpoint)
    if not (model / "config.json").exists():
        raise ValueError(f"{checkpoint}: no model directory (no config.json in {model})")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out}: exists and is not empty")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # the older layout kept the trainer state in the model directory: everything but it
    shutil.copytree(model, tmp, ignore=shutil.ignore_patterns(_STATE))
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="empo2-export", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory, a run directory or its checkpoints/")
    parser.add_argument("out", type=Path, help="the HF model directory to write (new or empty)")
    args = parser.parse_args(argv)
    try:
        checkpoint = find_checkpoint(args.checkpoint)
        out = export_checkpoint(checkpoint, args.out)
    except ValueError as exc:
        print(f"empo2-export: {exc}", file=sys.stderr)
        return 2
    print(f"exported {checkpoint} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
