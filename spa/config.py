"""Configuration of SPA's warm start (`empo2-spa`, spa/main.py): the self-play collection in the
world-model turn format and the SFT on it. The defaults are the paper's scale (arXiv 2510.15047 and its
code, shiqichen17/SPA: 1280 trajectories of at most 5 turns of 400 tokens at temperature 1, 5 epochs at
lr 1e-4, global batch 16, length 2048, AdamW (0.9, 0.95), weight decay 0.01, cosine with 10% warm-up,
gradient clip 1.0, an 80/20 split with seed 42); profile=cpu sets a scale that fits a CPU check."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.choices import Choice, Device
from common.config import at_least, check, positive, within


class Malformed(Choice):
    """What the SFT makes of a collected turn without the world-model tags (spa.malformed)."""

    drop = "drop"
    rebuild = "rebuild"


@dataclass
class SpaConfig:
    # collection: the base policy on the training variations of replay_buffer.tasks (never a test one)
    episodes: int = 1280  # episodes collected (the paper: 5 batches x 32 env groups x 8)
    max_turns: int = 5  # turns per episode
    max_turn_tokens: int = 400  # a world-model turn's cap (observation, reasoning, prediction, answer)
    temperature: float = 1.0  # the collection's sampling temperature
    envs: int = 2  # ScienceWorld envs played in parallel
    # SFT
    epochs: int = 5  # the paper's ablation: 1 epoch 29.2 vs 5 epochs 59.8 Pass@1 on Sokoban
    batch_rows: int = 16  # rows (assistant turns) per optimizer step, the paper's global batch
    lr: float = 1e-4  # the SFT's peak learning rate (AdamW)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW's
    weight_decay: float = 0.01  # AdamW's decoupled weight decay
    warmup_fraction: float = 0.1  # of the optimizer steps, then cosine to 0
    max_grad_norm: float = 1.0  # the gradient's global norm is clipped to this
    max_length: int = 2048  # tokens of one episode's sequence (its later turns are cut past it)
    holdout_fraction: float = 0.2  # episodes held out for the loss and the next-state accuracy
    split_seed: int = 42  # which episodes are held out
    # a turn without its observation, prediction or answer: `drop` leaves it untrained (the paper's filter, its
    # Fig. 8); `rebuild` trains it rebuilt from the true states and the action executed, its reasoning empty
    # (a model that never follows the format, as the embedded 135M one: 0 of 18 turns well-formed)
    malformed: Malformed = Malformed.drop
    device: Device = Device.auto  # the SFT's: auto (CUDA if visible) | cpu | cuda (fails at start without a GPU)

    def validate(self) -> None:
        for name in ("episodes", "max_turns", "max_turn_tokens", "envs", "epochs", "batch_rows", "max_length"):
            at_least(name, getattr(self, name), 1)
        within("temperature", self.temperature, 0.0, 10.0)
        positive("lr", self.lr)
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas", "two values in [0, 1)")
        at_least("weight_decay", self.weight_decay, 0)
        within("warmup_fraction", self.warmup_fraction, 0.0, 1.0)
        positive("max_grad_norm", self.max_grad_norm)
        within("holdout_fraction", self.holdout_fraction, 0.0, 0.9)
