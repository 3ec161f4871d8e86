"""The policy server's section (`policy_server`): the vLLM engine that serves the policy and takes
the learner's weights."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.choices import Choice, Device
from common.config import at_least, check, gpu_list


class Dtype(Choice):
    auto = "auto"  # float32 on CPU (bf16 is ~5x slower on AVX2), bfloat16 on GPU
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Executor(Choice):
    """Where vLLM's model worker runs (its distributed_executor_backend)."""

    # uni on CPU with one device: the worker in the engine core's process, one process fewer to start
    # (sooner ready, the same throughput and greedy tokens: benchmarks/server_startup.py); vLLM's own
    # choice elsewhere
    auto = "auto"
    uni = "uni"  # the worker in the engine core's process (one device only)
    mp = "mp"  # a worker process per device (vLLM's CPU default)


class OnUpdate(Choice):
    finish = "finish"  # requests in flight at a weight update finish on the old weights first
    abort = "abort"  # they are aborted and run again on the new weights (the update waits for nothing)


@dataclass
class PolicyServerConfig:
    index: int = 0  # which of endpoints.policy_servers this process serves (set per process)
    device: Device = Device.auto  # auto | cpu | cuda; "cuda" without a GPU fails at start-up
    dtype: Dtype = Dtype.auto  # auto = float32 on CPU, bfloat16 on GPU
    max_model_len: int = 2048  # prompt + response tokens per request
    gpu_memory_utilization: float = 0.3  # GPU: the share of device memory vLLM may use
    # CPU: vLLM's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND): "nobind" = one per core, unpinned; a core
    # list ("0", "0-1") pins one thread per listed core. "0" on a 2-core host leaves a core to the env
    # actors and the learner (benchmarks/env_throughput.py: as many env steps with several actors, for
    # less CPU; fewer with one)
    cpu_omp_threads_bind: str = "nobind"
    # CPU: host memory for the KV cache (1 GiB = ~23k tokens of the 135M model); vLLM's own CPU default
    # takes a share of all RAM per engine (OOM with two)
    cpu_kv_cache_gib: int = 1
    tensor_parallel_size: int = 1  # >1 needs as many GPUs (vLLM's native tensor parallelism)
    # each server's GPUs, by policy_server.index, its CUDA_VISIBLE_DEVICES ([[0,1],[2,3]]: two servers of
    # tensor_parallel_size 2 on one 4-GPU host); [] = every GPU the host shows (one server per host)
    gpus: list[list[int]] = field(default_factory=list)
    enforce_eager: bool = True  # CUDA graphs cost start-up time; worth it only on long GPU runs
    executor: Executor = Executor.auto  # auto (uni on CPU with one device) | uni | mp: where vLLM's worker runs
    on_update: OnUpdate = OnUpdate.finish  # requests in flight at a weight update: finish | abort
    # a server of a training run serves no generation until it holds the run's newest weights
    # (protocol/newest_version.py); a server of fixed weights (empo2-eval, test-time adaptation) sets false
    await_newest_version: bool = True
    weight_staging_dir: str = "/dev/shm"  # where received weights are staged for the engine
    allowed_weight_dirs: list[str] = field(default_factory=lambda: ["/dev/shm"])  # WeightFile paths must lie here
    max_weight_message_bytes: int = 1 << 30  # size limit of one WeightChunk message
    max_request_message_bytes: int = 8 << 20  # size limit of any other request

    def validate(self) -> None:
        at_least("index", self.index, 0)
        at_least("tensor_parallel_size", self.tensor_parallel_size, 1)
        check(
            not (self.tensor_parallel_size > 1 and self.device == "cpu"),
            "tensor_parallel_size",
            "> 1 needs CUDA GPUs, and policy_server.device=cpu",
        )
        check(
            not (self.executor == "uni" and self.tensor_parallel_size > 1),
            "executor",
            "uni runs one worker: tensor_parallel_size > 1 needs mp (or auto)",
        )
        check(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must be in (0, 1]")
        for i, devices in enumerate(self.gpus):
            named = gpu_list(f"gpus[{i}]", devices, self.device)
            check(
                named == self.tensor_parallel_size,
                f"gpus[{i}]",
                f"{devices!r} names {named} GPUs for a server of tensor_parallel_size {self.tensor_parallel_size}",
            )
        at_least("max_model_len", self.max_model_len, 1)
        at_least("cpu_kv_cache_gib", self.cpu_kv_cache_gib, 1)
