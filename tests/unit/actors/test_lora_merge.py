"""Adapter-only weight updates: what the learner sends (learner/lora.py) merged by the server onto
its base model (actors/policy_server/weight_receiver.py) equals peft's own merge, and bad adapters are refused
before the engine would load anything."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from actors.policy_server.weight_receiver import WeightUpdateError, merged_lora_weights
from learner.lora import adapter_tensors, apply_lora, lora_scale
from learner.weight_push import weight_tensors

TARGETS = ["q_proj", "v_proj", "down_proj"]


@pytest.fixture()
def base_and_lora(tmp_path):
    torch.manual_seed(0)
    base = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        )
    )
    base.save_pretrained(tmp_path)  # the server's base model directory
    model = apply_lora(base, rank=4, alpha=8, targets=TARGETS)
    with torch.no_grad():  # as after some training: B is no longer zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return tmp_path, model


def test_server_merge_equals_peft_merge(base_and_lora):
    base_dir, model = base_and_lora
    adapter = adapter_tensors(model)
    pushed = weight_tensors(model)  # the learner pushes the adapter only
    assert [n for n, _ in pushed] == [n for n, _ in adapter] and all(
        torch.equal(p, a) for (_, p), (_, a) in zip(pushed, adapter)
    )
    assert len(adapter) == 2 * len(TARGETS) * 2 and lora_scale(model) == 2.0
    assert {n for n, _ in adapter} >= {
        "model.layers.0.self_attn.q_proj.lora_A.weight",
        "model.layers.1.mlp.down_proj.lora_B.weight",
    }
    merged = dict(merged_lora_weights(str(base_dir), dict(adapter), lora_scale(model)))
    expected = model.merge_and_unload().state_dict()
    assert set(merged) == set(expected) - {"lm_head.weight"}  # tied: not in the saved base either
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.equal(
        merged["model.layers.0.self_attn.q_proj.weight"],
        LlamaForCausalLM.from_pretrained(base_dir).state_dict()["model.layers.0.self_attn.q_proj.weight"],
    )


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda a: a.pop("model.layers.0.self_attn.q_proj.lora_B.weight"), "unpaired"),
        (
            lambda a: a.update(
                {
                    "model.layers.9.self_attn.q_proj.lora_A.weight": torch.zeros(4, 32),
                    "model.layers.9.self_attn.q_proj.lora_B.weight": torch.zeros(32, 4),
                }
            ),
            "no base weight",
        ),
        (lambda a: a.update({"model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(7, 4)}), "do not fit"),
    ],
)
def test_bad_adapters_are_refused(base_and_lora, break_it, message):
    base_dir, model = base_and_lora
    adapter = dict(adapter_tensors(model))
    break_it(adapter)
    with pytest.raises(WeightUpdateError, match=message):
        merged_lora_weights(str(base_dir), adapter, 2.0)
