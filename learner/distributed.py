"""Data parallelism for the learner: torch.distributed + FSDP2, applied here and nowhere else.

    torchrun --nproc_per_node=N -m pipeline empo2-learner [key=value ...]   N ranks on one host
    empo2-learner [key=value ...]                                   the same code as a group of one

Backend gloo on CPU, nccl on CUDA (learner.device). Every rank holds a shard of the weights,
gradients and optimizer state (fully_shard on each decoder layer, then on the scorer as root).
Rank 0 alone talks to the replay buffer and the policy servers: each Batch travels to the other
ranks as its msgpack frames (protocol/codec.py; never pickle) in a uint8 tensor. Every rank
builds the same samples and trains on its share (learner/train.py, train_step); gradients are
summed across ranks and divided by the all-reduced kept-token count, so N ranks take the step
one process would. Full weights (push, checkpoint) and the optimizer state are gathered to rank
0; a resume loads the full state on every rank, which shards it again.

Every forward of a sharded module all-gathers, so all ranks must run the same number of
forwards and backwards: `synced` pads a rank's list of micro-batches to the longest one.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from protocol.codec import Message, decode, encode, pack_frames, unpack_frames

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def init(device: str) -> torch.device:
    """Join torchrun's process group (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the environment) or,
    in a plain process, start a group of one with an in-memory store; returns this rank's device.
    `device` is learner.device (auto | cpu | cuda, validated at load)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "learner.device=cuda but torch sees no CUDA device (CPU-only torch build, or no GPU visible); "
            "use learner.device=cpu or auto"
        )
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if not dist.is_initialized():
        backend = "nccl" if cuda else "gloo"
        if "RANK" in os.environ:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank()


def world_size() -> int:
    return dist.get_world_size()


def _comm_device() -> torch.device:
    """Where collective tensors live: nccl only moves CUDA tensors."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def shard(scorer: torch.nn.Module, layers: torch.nn.ModuleList, device: torch.device) -> None:
    """FSDP2: one unit per decoder layer (all-gathered just before it runs), the rest (embeddings,
    final norm, tied lm_head) in the root unit, on a mesh of `device`'s type (the learner's: FSDP's
    own default mesh is on whatever accelerator torch finds, and moved the parameters of a
    learner.device=cpu learner to a visible GPU). Gradients are summed across ranks, not averaged:
    train_step divides them by the global kept-token count."""
    mesh = init_device_mesh(device.type, (world_size(),))
    for unit in [*layers, scorer]:  # inner units first: the root takes what is left
        fully_shard(unit, mesh=mesh)
        unit.set_gradient_divide_factor(1.0)  # per unit
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no pre-multiplied sum


def all_reduce(values: list[float], op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=op)
    return t.tolist()


def synced(micro_batches: list[list[int]]) -> list[list[int]]:
    """The rank's micro-batches padded with empty ones to the most any rank has."""
    (most,) = all_reduce([len(micro_batches)], dist.ReduceOp.MAX)
    return micro_batches + [[] for _ in range(int(most) - len(micro_batches))]


def broadcast_message(msg: Message | None) -> Message:
    """Rank 0's message on every rank, as msgpack frames in a uint8 tensor."""
    device = _comm_device()
    blob = pack_frames(encode(msg)) if rank() == 0 else b""
    size = torch.tensor([len(blob)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    data = (
        torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(device)
        if rank() == 0
        else torch.empty(int(size), dtype=torch.uint8, device=device)
    )
    dist.broadcast(data, src=0)
    if rank() == 0:
        return msg
    return decode(unpack_frames(data.cpu().numpy().tobytes()), max_bytes=int(size) + (1 << 20))


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict on CPU on rank 0 ({} elsewhere), HF-named. A collective."""
    return get_model_state_dict(model, options=_FULL)


class FullOptimizerState:
    """The optimizer's state as one full, parameter-named dict (checkpoint.py's `stateful`
    protocol): gathering it is a collective; loading it on every rank re-shards it."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        return get_optimizer_state_dict(self.model, self.optimizer, options=_FULL)

    def load_state_dict(self, state: dict) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(full_state_dict=True))


class FullTrainableState:
    """The trainable parameters alone (LoRA adapters: the frozen base comes from the model files) as
    one full dict for the checkpoint; gathering is a collective, loading re-shards on every rank."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def state_dict(self) -> dict:
        trainable = {name for name, p in self.model.named_parameters() if p.requires_grad}
        return {name: t for name, t in get_model_state_dict(self.model, options=_FULL).items() if name in trainable}

    def load_state_dict(self, state: dict) -> None:
        set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True, strict=False))
