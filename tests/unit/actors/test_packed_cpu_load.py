"""The CPU fast path of a weight update (actors/policy_server/worker_ext.load_packed_cpu), on a stand-in
with the shape of a vLLM CPU model: linear layers whose weight was packed away (empty parameter,
a `cpu_linear` handler), a fused qkv projection, a tied lm_head. The real engine's outputs after
such an update are checked against the learner in tests/integration/test_policy_server.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from actors.policy_server.worker_ext import load_packed_cpu
from protocol.weight_file import mapped_weights, write_weight_file

pytest.importorskip("vllm")


class UnquantizedLinearMethod:
    """Packs like vLLM's CPU dispatch: keeps a copy of the weight, drops the parameter."""

    def process_weights_after_loading(self, layer):
        layer.packed = layer.weight.detach().clone()
        if layer.drops_weight:
            layer.weight = nn.Parameter(torch.empty(0), requires_grad=False)


class PackedLinear(nn.Module):
    def __init__(self, out_features: int, in_features: int, drops_weight: bool = True):
        super().__init__()
        self.output_size_per_partition, self.input_size_per_partition = out_features, in_features
        self.weight = nn.Parameter(torch.zeros(out_features, in_features), requires_grad=False)
        self.quant_method, self.drops_weight, self.cpu_linear = UnquantizedLinearMethod(), drops_weight, True
        self.quant_method.process_weights_after_loading(self)


class TinyModel(nn.Module):
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}

    def __init__(self):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = PackedLinear(10, 4, drops_weight=False)  # an embedding keeps its weight
        self.model.attn = nn.Module()
        self.model.attn.qkv_proj = PackedLinear(4 + 2 + 2, 4)
        self.model.norm = nn.Module()
        self.model.norm.weight = nn.Parameter(torch.zeros(4), requires_grad=False)
        self.lm_head = PackedLinear(10, 4, drops_weight=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied


def hf_tensors(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "model.embed_tokens.weight": (10, 4),
        "model.attn.q_proj.weight": (4, 4),
        "model.attn.k_proj.weight": (2, 4),
        "model.attn.v_proj.weight": (2, 4),
        "model.norm.weight": (4,),
    }
    return [(name, torch.randn(*shape, generator=g)) for name, shape in shapes.items()]


def test_update_repacks_fused_and_tied_layers(tmp_path):
    model, path = TinyModel(), tmp_path / "w.safetensors"
    write_weight_file(path, hf_tensors())
    with mapped_weights(path) as weights:
        assert load_packed_cpu(model, weights)
    want = dict(hf_tensors())
    qkv = torch.cat([want[f"model.attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(model.model.attn.qkv_proj.packed, qkv) and model.model.attn.qkv_proj.weight.numel() == 0
    assert torch.equal(model.model.norm.weight, want["model.norm.weight"])
    assert torch.equal(model.model.embed_tokens.weight, want["model.embed_tokens.weight"])
    assert torch.equal(model.lm_head.packed, want["model.embed_tokens.weight"])  # the tied head packs the new embedding
    # the packed copy owns its bytes: rewriting the file does not reach the serving weights
    write_weight_file(path, hf_tensors(seed=1))
    assert torch.equal(model.model.attn.qkv_proj.packed, qkv)


@pytest.mark.parametrize("change", ["missing", "extra", "shape"])
def test_anything_unmatched_leaves_the_model_untouched(tmp_path, change):
    model, path = TinyModel(), tmp_path / "w.safetensors"
    tensors = hf_tensors()
    if change == "missing":
        tensors = tensors[:-1]
    elif change == "extra":
        tensors.append(("model.unknown.weight", torch.ones(3)))
    else:
        tensors[1] = ("model.attn.q_proj.weight", torch.ones(5, 4))
    write_weight_file(path, tensors)
    before = {n: p.clone() for n, p in model.named_parameters()}
    with mapped_weights(path) as weights:
        assert not load_packed_cpu(model, weights)  # the generic loader takes it from here
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert torch.equal(model.model.attn.qkv_proj.packed, torch.zeros(8, 4))
