"""LoRA (learner.lora_rank > 0): low-rank adapters on the policy's linear projections (peft).

Only the adapters train, and only they travel to the policy servers: an adapter-only push
(WeightChunk / WeightFile with lora_scale > 0) that each server merges onto its own copy of the
base model as W = W0 + scale * B @ A (actors/policy_server/weight_receiver.py, merged_lora_weights).
"""

from __future__ import annotations

import torch

from common.lora import lora_merged

_ADAPTER = "default"  # peft's name for the one adapter
_PREFIX = "base_model.model."  # PeftModel -> LoraModel -> the HF model: HF names follow


def apply_lora(model, rank: int, alpha: float, targets: list[str]):
    """Wrap an HF causal LM: base weights frozen, A random, B zero (the policy starts unchanged)."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none")
    )


def is_lora(model) -> bool:
    return hasattr(model, "peft_config")


def _lora_layers(model):
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and _ADAPTER in module.lora_A:
            yield name.removeprefix(_PREFIX), module


def lora_scale(model) -> float:
    """alpha / r, the factor the servers apply to B @ A (one value: every layer shares the config)."""
    scales = {float(module.scaling[_ADAPTER]) for _, module in _lora_layers(model)}
    if len(scales) != 1:
        raise ValueError(f"LoRA layers disagree on the scale: {sorted(scales)}")
    return scales.pop()


def adapter_tensors(model, state_dict: dict[str, torch.Tensor] | None = None) -> list[tuple[str, torch.Tensor]]:
    """`<HF module>.lora_A.weight` [r, in] and `<HF module>.lora_B.weight` [out, r] per adapted module,
    from the model or from its full (peft-named) state dict when it is sharded (learner/distributed.py)."""
    tensors = []
    for name, module in _lora_layers(model):
        for x, weights in (("A", module.lora_A), ("B", module.lora_B)):
            t = (
                weights[_ADAPTER].weight
                if state_dict is None
                else state_dict[f"{_PREFIX}{name}.lora_{x}.{_ADAPTER}.weight"]
            )
            tensors.append((f"{name}.lora_{x}.weight", t.detach()))
    return tensors


def merged_weights(state_dict: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A LoRA policy's full peft-named state dict -> HF-named weights with each adapted module's
    W = W0 + scale * B @ A: the policy as a plain HF checkpoint (vLLM and transformers load it)."""
    merged = {}
    for key, weight in state_dict.items():
        name = key.removeprefix(_PREFIX)
        module = name.removesuffix(".base_layer.weight")
        if ".lora_" in name:
            continue
        if module != name:  # an adapted module's frozen W0
            a, b = (state_dict[f"{_PREFIX}{module}.lora_{x}.{_ADAPTER}.weight"] for x in "AB")
            merged[f"{module}.weight"] = lora_merged(weight, a, b, scale)
        else:
            merged[name] = weight
    return merged
