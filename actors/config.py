"""Configuration of the two actor-side roles: policy servers (vLLM) and env actors (ScienceWorld)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PolicyServerConfig:
    index: int = 0  # which of endpoints.policy_servers this process serves (set per process)
    device: str = "auto"  # "auto" | "cpu" | "cuda"; "cuda" without a GPU fails at start-up
    dtype: str = "auto"  # "auto" = float32 on CPU (bf16 is ~5x slower on AVX2), bfloat16 on GPU
    max_model_len: int = 2048  # prompt + response tokens per request
    gpu_memory_utilization: float = 0.3  # GPU: the share of device memory vLLM may use
    cpu_omp_threads_bind: str = (
        "nobind"  # CPU: vLLM's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND): "nobind" = one per core,
    )
    #                           unpinned; a core list ("0", "0-1") pins one thread per listed core. "0" on a 2-core host leaves a
    #                           core to the env actors and the learner (benchmarks/README.md: same env steps/s at 4 actors, 0.7 of
    #                           the CPU; slower with 1 actor)
    cpu_kv_cache_gib: int = 1  # CPU: host memory for the KV cache (1 GiB = ~23k tokens of the 135M model);
    #                           vLLM's own CPU default takes a share of all RAM per engine (OOM with two)
    tensor_parallel_size: int = 1  # >1 needs as many GPUs (vLLM's native tensor parallelism)
    enforce_eager: bool = True  # CUDA graphs cost start-up time; worth it only on long GPU runs
    on_update: str = "finish"  # requests in flight at a weight update: "finish" on the old weights first,
    #                           or "abort" them and run them again on the new weights (the update waits for nothing)
    weight_staging_dir: str = "/dev/shm"  # where received weights are staged for the engine
    allowed_weight_dirs: list[str] = field(default_factory=lambda: ["/dev/shm"])  # WeightFile paths must lie here
    max_weight_message_bytes: int = 1 << 30  # size limit of one WeightChunk message
    max_request_message_bytes: int = 8 << 20  # size limit of any other request


@dataclass
class EnvActorConfig:
    index: int = 0  # this actor's number (set per process): its id and metrics port
    envs_per_actor: int = 1  # ScienceWorld envs (one JVM and one thread each) played concurrently by one process
    server_selection: str = (
        "least_loaded"  # "least_loaded" (fewest requests in flight from this process) | "round_robin"
    )
    max_steps: int = 30  # step limit per episode
    max_steps_per_task: dict[str, int] = field(default_factory=dict)  # per-task limits over max_steps,
    #                           e.g. +env_actor.max_steps_per_task.boil=60 ("+": Hydra adds a key to the map)
    history_window: int = 4  # past (action, observation) pairs shown in the prompt
    max_action_tokens: int = 32  # generation cap for an action
    temperature: float = 1.0  # sampling temperature in training (0.4 at evaluation)
    simplification: str = "easy"  # ScienceWorld simplification preset
    generate_timeout_s: float = 300.0  # one action generation; generous for CPU start-up
    memory_timeout_s: float = 5.0  # retrieval; after it, the turn goes without tips (counted)
    memory_retry_after_s: float = 30.0  # after a failed retrieval, go without tips at once for this long
    buffer_timeout_s: float = 30.0  # assignment request / trajectory upload, per try
    upload_retries: int = 20  # a finished episode is retried this often before the actor fails
    startup_timeout_s: float = 900.0  # how long to wait for the servers to come up
