"""learner/lean_activations.py: the lean MLP and RMSNorm give the stock modules' outputs and gradients
(the MLP's bit for bit, the norm's within float rounding), keep fewer bytes for the backward, and
leave the model's parameter names alone; LoRA-wrapped projections keep the stock forward."""

from __future__ import annotations

import copy

import pytest
import torch

from learner.lean_activations import lean_activations
from learner.lora import apply_lora
from testing.factories import tiny_llama


def _saved_bytes(fn) -> int:
    """The bytes autograd keeps for the backward of fn(), each storage once."""
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def _loss(model, ids):
    return model(input_ids=ids).logits.float().logsumexp(-1).mean()


def test_the_model_gives_the_stock_outputs_and_gradients():
    stock = tiny_llama(50, initializer_range=0.2)
    lean = copy.deepcopy(stock)
    assert lean_activations(lean) == {"mlp": 2, "rms_norm": 5}  # 2 layers x (mlp, 2 norms) + the final norm
    ids = torch.randint(0, 50, (3, 17))
    loss_stock, loss_lean = _loss(stock, ids), _loss(lean, ids)
    assert torch.equal(loss_stock, loss_lean)
    loss_stock.backward()
    loss_lean.backward()
    grads = dict(lean.named_parameters())
    assert set(grads) == {n for n, _ in stock.named_parameters()}  # the names the checkpoint and push use
    for name, p in stock.named_parameters():
        torch.testing.assert_close(grads[name].grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_mlp_alone_gives_the_stock_gradients_bit_for_bit():
    """Autograd's own operations on the same values (in a model, the norms' rounding reaches it)."""
    stock = tiny_llama(50, initializer_range=0.2).model.layers[0].mlp
    lean = copy.deepcopy(stock)
    lean_activations(lean)
    x = torch.randn(3, 11, 32)
    inputs = [x.clone().requires_grad_(True) for _ in range(2)]
    outputs = [module(i) for module, i in zip((stock, lean), inputs)]
    assert torch.equal(*outputs)
    grad_out = torch.randn_like(outputs[0])
    for out in outputs:
        out.backward(grad_out)
    assert torch.equal(inputs[0].grad, inputs[1].grad)
    for (name, p), q in zip(stock.named_parameters(), lean.parameters()):
        assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("part", ["mlp", "input_layernorm"])
def test_a_module_keeps_fewer_bytes_for_its_backward(part):
    stock = getattr(tiny_llama(50).model.layers[0], part)
    lean = copy.deepcopy(stock)
    lean_activations(lean)
    x = torch.randn(4, 64, 32, requires_grad=True)
    kept_stock, kept_lean = _saved_bytes(lambda: stock(x)), _saved_bytes(lambda: lean(x))
    token = 4 * 64 * 4  # one float per token
    hidden, intermediate = 32 * token, 64 * token
    if part == "mlp":  # x, gate, silu(gate), up, product -> x, gate, up (the weights besides)
        weights = 3 * 32 * 64 * 4
        assert kept_stock - weights == hidden + 4 * intermediate
        assert kept_lean - weights == hidden + 2 * intermediate
    else:  # x and x * rstd (and rstd) -> x and rstd (the weight besides)
        assert kept_stock - 32 * 4 == 2 * hidden + token
        assert kept_lean - 32 * 4 == hidden + token


def test_lora_projections_keep_the_stock_forward_and_train_only_the_adapters():
    model = apply_lora(tiny_llama(50), 4, 8.0, ["gate_proj", "up_proj", "down_proj"])
    assert lean_activations(model) == {"mlp": 0, "rms_norm": 5}
    _loss(model, torch.randint(0, 50, (2, 9))).backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trained and all("lora_" in n for n in trained)


def test_applying_twice_changes_nothing_and_the_stock_forward_comes_back():
    model = tiny_llama(50)
    lean_activations(model)
    assert lean_activations(model) == {"mlp": 0, "rms_norm": 0}
    assert lean_activations(model, lean=False) == {"mlp": 2, "rms_norm": 5}
    assert {type(m).__name__ for m in model.modules()} >= {"LlamaMLP", "LlamaRMSNorm"}
    assert not any(type(m).__name__.startswith("Lean") for m in model.modules())


def test_a_frozen_model_gets_no_weight_gradients():
    model = tiny_llama(50)
    lean_activations(model)
    model.requires_grad_(False)
    embeds = model.model.embed_tokens(torch.randint(0, 50, (2, 9))).detach().requires_grad_(True)
    model(inputs_embeds=embeds).logits.sum().backward()
    assert embeds.grad is not None and all(p.grad is None for p in model.parameters())


def test_the_trainer_steps_as_with_autograds_own_activations(tmp_path):
    """learner.lean_activations (the default) on the Trainer as the learner runs it (FSDP2 as a group
    of one): the same loss, the same weights after two steps within float rounding."""
    from learner.config import LearnerConfig
    from learner.train import Trainer
    from testing.factories import mixed_group, save_tiny_model

    base = save_tiny_model(tmp_path / "base", initializer_range=0.2)
    results = {}
    for lean in (True, False):
        cfg = LearnerConfig(lr=1e-2, total_steps=2, device="cpu", low_prob_threshold=None, lean_activations=lean)
        trainer = Trainer(cfg, base, seed=0)
        assert any(type(m).__name__.startswith("Lean") for m in trainer.scorer.modules()) == lean
        losses = [trainer.step(mixed_group(i)).loss for i in range(2)]
        results[lean] = losses, trainer.full_weights()
    assert results[True][0] == pytest.approx(results[False][0], abs=1e-6)
    # Adam divides each update by its gradient's scale: where an element's two gradients nearly cancel,
    # the matmuls' rounding (which differs between CPUs) moves it by a few 1e-6 (3.6e-6 on the machine
    # of 2026-12-06 evening, under 1e-6 on the one before), 0.04% of the lr; a wrong gradient moves ~lr
    for name, value in results[False][1].items():
        torch.testing.assert_close(results[True][1][name], value, rtol=1e-5, atol=2e-5, msg=name)
