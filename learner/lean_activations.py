"""The same forward, fewer tensors kept for the backward: a gated MLP and an RMSNorm whose autograd
functions save what their gradients need and recompute the cheap rest.

Why: on CPU the learner's peak memory is its activations, most of them in the MLPs and the norms
(benchmarks/learner_throughput.py), and that memory is what keeps `micro_batch_tokens` (and with it group packing's shared
prefix) small on the CPU profile. Per token and layer, autograd keeps for `down(silu(g) * up)`
the input x, g, silu(g), u and their product (4 x intermediate); `lean_mlp` keeps x, g and u and
recomputes silu(g) * u in the backward (an elementwise pass, no matmul again). An RMSNorm keeps its
input and the normalized input (2 x hidden); `lean_rms_norm` keeps the input and one scalar.
Together less activation memory, at the cost of the elementwise recompute. Unlike activation
checkpointing (learner.gradient_checkpointing) no matmul runs twice.

Exactness: the MLP's backward is autograd's own sequence of operations on the same values, so its
gradients are the stock module's bit for bit; the norm's backward is the closed form of the same
derivative, equal within float rounding (tests/unit/learner/test_lean_activations.py).

Applied by swapping the class of each matching module for a subclass whose forward calls these
functions (what FSDP2's fully_shard does too): parameter names, state dicts, checkpoints and the
weight push see the same modules. A module they do not match (LoRA-wrapped projections, an MLP with
biases or another activation) keeps its stock forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _GatedMLP(torch.autograd.Function):
    """down(silu(x W_gate^T) * (x W_up^T)) without biases, saving x, the gate and the up projection."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down):
        gate, up = F.linear(x, w_gate), F.linear(x, w_up)
        ctx.save_for_backward(x, gate, up, w_gate, w_up, w_down)
        return F.linear(F.silu(gate) * up, w_down)

    @staticmethod
    def backward(ctx, grad_out):
        x, gate, up, w_gate, w_up, w_down = ctx.saved_tensors
        need_x, need_gate, need_up, need_down = ctx.needs_input_grad
        activated = F.silu(gate)
        hidden = activated * up  # recomputed: the one tensor of the forward not kept
        grad_hidden = grad_out @ w_down
        grad_up = grad_hidden * activated
        grad_gate = torch.ops.aten.silu_backward(grad_hidden * up, gate)  # autograd's own kernel
        grad_x = grad_gate @ w_gate + grad_up @ w_up if need_x else None
        return (
            grad_x,
            _weight_grad(grad_gate, x) if need_gate else None,
            _weight_grad(grad_up, x) if need_up else None,
            _weight_grad(grad_out, hidden) if need_down else None,
        )


def _weight_grad(grad_out: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """A bias-free linear layer's weight gradient: [.., out], [.., in] -> [out, in]."""
    return grad_out.reshape(-1, grad_out.shape[-1]).T @ inputs.reshape(-1, inputs.shape[-1])


class _RMSNorm(torch.autograd.Function):
    """weight * x / sqrt(mean(x^2) + eps), in fp32 as HF's, saving x and the reciprocal root."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        x32 = x.float()
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return weight * (x32 * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        x, rstd, weight = ctx.saved_tensors
        normed = x.float() * rstd
        grad_weight = (
            (grad_out * normed.to(x.dtype)).reshape(-1, x.shape[-1]).sum(0) if ctx.needs_input_grad[1] else None
        )
        grad_normed = (grad_out * weight).float()
        grad_x = rstd * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None


def lean_mlp(module, x: torch.Tensor) -> torch.Tensor:
    return _GatedMLP.apply(x, module.gate_proj.weight, module.up_proj.weight, module.down_proj.weight)


def lean_rms_norm(module, x: torch.Tensor) -> torch.Tensor:
    return _RMSNorm.apply(x, module.weight, module.variance_epsilon)


def _is_gated_mlp(module) -> bool:
    projections = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    return (
        all(type(p) is torch.nn.Linear and p.bias is None for p in projections)
        and getattr(getattr(module, "config", None), "hidden_act", None) == "silu"
    )


def _is_rms_norm(module) -> bool:
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")


_STOCK_CLASSES: dict[type, type] = {}  # lean class -> the stock class it was made from


def _lean_class(cls: type, forward) -> type:
    for lean, stock in _STOCK_CLASSES.items():
        if stock is cls:
            return lean
    lean = type(f"Lean{cls.__name__}", (cls,), {"forward": forward})
    _STOCK_CLASSES[lean] = cls
    return lean


def lean_activations(model: torch.nn.Module, lean: bool = True) -> dict[str, int]:
    """Give every gated MLP and RMSNorm of `model` the lean forward (lean=False: the stock one back,
    for a measurement in one process); how many of each changed."""
    changed = {"mlp": 0, "rms_norm": 0}
    for module in model.modules():
        cls = type(module)
        if not lean:
            if cls in _STOCK_CLASSES:
                module.__class__ = _STOCK_CLASSES[cls]
                changed["mlp" if _is_gated_mlp(module) else "rms_norm"] += 1
        elif cls in _STOCK_CLASSES:
            continue
        elif _is_gated_mlp(module):
            module.__class__ = _lean_class(cls, lean_mlp)
            changed["mlp"] += 1
        elif _is_rms_norm(module):
            module.__class__ = _lean_class(cls, lean_rms_norm)
            changed["rms_norm"] += 1
    return changed
