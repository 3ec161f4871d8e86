"""Resume: a run stopped after step k and resumed from its checkpoint takes exactly the step k+1
an uninterrupted run takes (same loss, same learning rate, same weights), also under a warm-up +
cosine schedule; retention keeps the newest checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from common.model_prep import resolve_model
from learner.checkpoint import list_checkpoints, load_trainer_state, model_dir, save_checkpoint
from learner.config import LearnerConfig
from learner.optim import build_optimizer
from learner.samples import TurnSample
from learner.step import StepContext, train_step
from protocol.messages import ON_POLICY

CFG = LearnerConfig(lr=1e-2, lr_schedule="cosine", warmup_steps=2, total_steps=5)


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def _tokenizer() -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    )


def _samples(step: int) -> list[TurnSample]:
    rng = np.random.default_rng(step)
    out = []
    for i in range(3):
        prompt = rng.integers(0, 32, 6).astype(np.int32)
        response = rng.integers(0, 32, 3).astype(np.int32)
        out.append(
            TurnSample(prompt, prompt, response, np.full(3, -3.5, np.float32), float(i - 1), ON_POLICY, step, False)
        )
    return out


@pytest.mark.parametrize("k", [1, 3])
def test_resumed_step_equals_uninterrupted_step(tmp_path, k):
    model = _model()
    optimizer, scheduler = build_optimizer(model.parameters(), CFG)
    lrs = [
        train_step(StepContext(model, optimizer, _samples(step), CFG, step, scheduler=scheduler)).lr
        for step in range(k)
    ]
    save_checkpoint(
        tmp_path,
        k,
        model,
        _tokenizer(),
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
        keep_last=2,
    )
    uninterrupted = train_step(StepContext(model, optimizer, _samples(k), CFG, version=k, scheduler=scheduler))
    assert uninterrupted.lr != lrs[-1]  # the schedule moves at the resumed step (warm-up at k=1, decay at k=3)

    (path,) = list_checkpoints(tmp_path)
    resumed_model = LlamaForCausalLM.from_pretrained(model_dir(path), dtype=torch.float32)
    resumed_optimizer, resumed_scheduler = build_optimizer(resumed_model.parameters(), CFG)
    assert load_trainer_state(path, {"optimizer": resumed_optimizer, "scheduler": resumed_scheduler}) == k
    resumed = train_step(
        StepContext(resumed_model, resumed_optimizer, _samples(k), CFG, version=k, scheduler=resumed_scheduler)
    )

    assert resumed.lr == uninterrupted.lr
    assert resumed.loss == pytest.approx(uninterrupted.loss, abs=1e-7)
    for (name, a), b in zip(model.state_dict().items(), resumed_model.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)  # Adam's moments were restored too


def test_retention_keeps_the_newest_complete_checkpoints(tmp_path):
    model = _model()
    optimizer, scheduler = build_optimizer(model.parameters(), CFG)
    for version in (1, 2, 3, 4):
        save_checkpoint(
            tmp_path,
            version,
            model,
            _tokenizer(),
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
            keep_last=2,
        )
    (tmp_path / "step_000009").mkdir()  # incomplete (no trainer state): never listed
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000003", "step_000004"]
    # both parts of a dropped checkpoint go: nothing of steps 1 and 2 is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000003", "step_000004", "step_000009"]


def test_the_model_directory_is_a_clean_hf_directory_beside_the_trainer_state(tmp_path):
    model = _model()
    optimizer, scheduler = build_optimizer(model.parameters(), CFG)
    path = save_checkpoint(
        tmp_path, 7, model, _tokenizer(), {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, 1
    )
    assert (path / "trainer_state.pt").is_file() and model_dir(path) == path / "model"
    files = {p.name for p in (path / "model").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= files and "trainer_state.pt" not in files
    assert resolve_model(str(path)) == str(path / "model")  # model.name=<checkpoint> serves its model directory


def _old_layout(root, version: int, model, states: dict):
    """A checkpoint as runs before wrote it: the trainer state inside the HF directory."""
    import random

    old = root / f"step_{version:06d}"
    model.save_pretrained(old, safe_serialization=True)
    _tokenizer().save_pretrained(old)
    rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    torch.save({"version": version, "stateful": states, "rng": rng}, old / "trainer_state.pt")
    return old


def test_a_checkpoint_of_the_older_layout_still_resumes(tmp_path):
    model = _model()
    optimizer, scheduler = build_optimizer(model.parameters(), CFG)
    train_step(StepContext(model, optimizer, _samples(0), CFG, 0, scheduler=scheduler))
    old = _old_layout(tmp_path, 1, model, {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()})
    assert list_checkpoints(tmp_path) == [old] and model_dir(old) == old and resolve_model(str(old)) == str(old)
    resumed = LlamaForCausalLM.from_pretrained(model_dir(old), dtype=torch.float32)
    resumed_optimizer, resumed_scheduler = build_optimizer(resumed.parameters(), CFG)
    assert load_trainer_state(old, {"optimizer": resumed_optimizer, "scheduler": resumed_scheduler}) == 1
    for a, b in zip(model.state_dict().values(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_export_writes_an_hf_directory_transformers_loads_with_the_same_logits(tmp_path):
    from transformers import AutoModelForCausalLM

    from learner.export import export_checkpoint, main
    from learner.policy_model import response_logprobs
    from learner.train import Trainer
    from testing.factories import mixed_group, save_tiny_model

    base = save_tiny_model(tmp_path / "base", initializer_range=0.2)
    trainer = Trainer(LearnerConfig(lr=1e-2, total_steps=2, device="cpu"), base, seed=0)
    trainer.step(mixed_group(0))
    path = trainer.save_checkpoint(tmp_path / "run" / "checkpoints", keep_last=1)
    out = export_checkpoint(tmp_path / "run", tmp_path / "exported")  # a run directory: its newest checkpoint
    assert "trainer_state.pt" not in {p.name for p in out.iterdir()}
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    prompt, response = torch.tensor([3, 7, 11, 5]), torch.tensor([9, 2])
    with torch.no_grad():  # the trained policy's log-probs (its logits at the response) from the export
        torch.testing.assert_close(
            response_logprobs(exported, prompt, response), response_logprobs(trainer.scorer, prompt, response)
        )
    assert main([str(path), str(out)]) == 2  # a non-empty OUT is refused
    old = _old_layout(tmp_path / "old", 3, exported, {})
    assert main([str(old), str(tmp_path / "from_old")]) == 0
    assert "trainer_state.pt" not in {p.name for p in (tmp_path / "from_old").iterdir()}
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "from_old").config.vocab_size == 40


def test_with_a_kl_term_the_resumed_trainer_keeps_the_runs_initial_policy_as_its_reference(tmp_path):
    """The KL reference is the policy the run started from: a Trainer resumed from a checkpoint
    (given the base model as reference_path, as the learner does) takes the uninterrupted step
    exactly; with the checkpoint itself as the reference (the earlier behaviour) it would not."""
    from learner.train import Trainer
    from testing.factories import mixed_group, save_tiny_model

    base = save_tiny_model(tmp_path / "base", initializer_range=0.2)
    cfg = LearnerConfig(lr=1e-2, kl_coef=0.5, total_steps=4, device="cpu", low_prob_threshold=None)
    trainer = Trainer(cfg, base, seed=0, reference_path=base)
    trainer.step(mixed_group(0))
    path = trainer.save_checkpoint(tmp_path / "checkpoints", keep_last=1)
    uninterrupted = trainer.step(mixed_group(1))
    assert uninterrupted.resident_mb > 0  # measured after each step: the floor the chaos audit judges
    expected = {k: v.clone() for k, v in trainer.full_weights().items()}

    def resumed(reference: str):
        again = Trainer(cfg, str(path), seed=0, resume_from=path, reference_path=reference)
        return again.step(mixed_group(1)), again.full_weights()

    stats, weights = resumed(base)
    assert stats.loss == pytest.approx(uninterrupted.loss, abs=1e-7) and stats.kl_mean == uninterrupted.kl_mean
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0)
    wrong, _ = resumed(str(path))  # the checkpoint as reference: KL 0 where the run had moved
    assert wrong.kl_mean != uninterrupted.kl_mean


def test_a_long_run_checkpoints_by_time_without_being_told():
    """learner.checkpoint_every_s (on by default): the first step past the interval since the last
    checkpoint writes one, so a crash repeats at most that much work; 0 turns it off."""
    import time
    from types import SimpleNamespace

    from learner import distributed
    from learner.train import Learner

    distributed.init("cpu")
    interval = LearnerConfig().checkpoint_every_s
    assert LearnerConfig().checkpoint_every == 0 and 0 < interval <= 3600
    learner = SimpleNamespace(lcfg=LearnerConfig(), version=5, is_rank0=True, _last_checkpoint=time.monotonic())
    assert not Learner.checkpoint_due(learner)
    learner._last_checkpoint -= interval
    assert Learner.checkpoint_due(learner)
    learner.lcfg = LearnerConfig(checkpoint_every_s=0)
    assert not Learner.checkpoint_due(learner)
    learner.lcfg = LearnerConfig(checkpoint_every=5, checkpoint_every_s=0)
    assert Learner.checkpoint_due(learner)
