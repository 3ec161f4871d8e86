"""LoRA in the learner (learner.lora_rank > 0): only the adapters train; the push is adapter-only;
a checkpoint holds the merged policy as plain HF weights and resumes the adapter exactly."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from learner.checkpoint import list_checkpoints
from learner.config import LearnerConfig
from learner.export import export_checkpoint
from learner.policy_model import response_logprobs
from learner.train import Trainer
from learner.weight_push import weight_tensors
from testing.factories import mixed_group, save_tiny_model

CFG = LearnerConfig(
    lr=1e-2,
    total_steps=4,
    lora_rank=4,
    lora_alpha=8.0,
    lora_targets=["q_proj", "v_proj"],
    device="cpu",
    low_prob_threshold=None,
)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> str:
    return save_tiny_model(tmp_path_factory.mktemp("base"), initializer_range=0.2)


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in trainer.full_weights().items()}


def test_only_adapters_train_and_only_they_are_pushed(base_dir):
    trainer = Trainer(CFG, base_dir, seed=0)
    before = _weights(trainer)
    trainer.step(mixed_group(0))
    trainer.step(mixed_group(1))  # B starts at 0: the second step moves A too
    after = _weights(trainer)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_A." in k or ".lora_B." in k for k in changed)
    pushed = dict(weight_tensors(trainer.model, trainer.full_weights()))
    assert set(pushed) == {
        f"model.layers.{i}.self_attn.{m}.lora_{x}.weight" for i in (0, 1) for m in ("q_proj", "v_proj") for x in "AB"
    }
    for name, t in pushed.items():
        layer, module = name.split(".")[2], name.split(".")[4]
        torch.testing.assert_close(
            t, after[f"base_model.model.model.layers.{layer}.self_attn.{module}.{name.split('.')[5]}.default.weight"]
        )


def test_checkpoint_is_the_merged_policy_and_resumes_the_adapter(base_dir, tmp_path):
    trainer = Trainer(CFG, base_dir, seed=0)
    trainer.step(mixed_group(0))
    trainer.step(mixed_group(1))
    path = trainer.save_checkpoint(tmp_path, keep_last=1)
    assert list_checkpoints(tmp_path) == [path]
    exported = export_checkpoint(path, tmp_path / "exported")  # empo2-export: the model directory alone
    merged = LlamaForCausalLM.from_pretrained(exported, dtype=torch.float32)  # a plain HF model: what vLLM would load
    prompt, response = torch.tensor([3, 7, 11, 5]), torch.tensor([9, 2])
    with torch.no_grad():
        torch.testing.assert_close(
            response_logprobs(merged, prompt, response), response_logprobs(trainer.scorer, prompt, response)
        )
    trainer.step(mixed_group(2))
    resumed = Trainer(CFG, base_dir, seed=0, resume_from=path)  # the base model plus the adapter state
    assert resumed.version == 2
    resumed.step(mixed_group(2))
    expected, got = _weights(trainer), _weights(resumed)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)
