"""Configuration of the two actor-side roles: policy servers (vLLM) and env actors (ScienceWorld).

They also read the shared sections of pipeline/config.py: `env` (the ScienceWorld episodes),
`weight_sync` (how the learner's weights arrive), `endpoints`, `model`, `metrics`."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.choices import Choice, Device


class Dtype(Choice):
    auto = "auto"  # float32 on CPU (bf16 is ~5x slower on AVX2), bfloat16 on GPU
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class OnUpdate(Choice):
    finish = "finish"  # requests in flight at a weight update finish on the old weights first
    abort = "abort"  # they are aborted and run again on the new weights (the update waits for nothing)


class ServerSelection(Choice):
    least_loaded = "least_loaded"  # the server with the fewest requests in flight from this process
    round_robin = "round_robin"


@dataclass
class PolicyServerConfig:
    index: int = 0  # which of endpoints.policy_servers this process serves (set per process)
    device: Device = Device.auto  # auto | cpu | cuda; "cuda" without a GPU fails at start-up
    dtype: Dtype = Dtype.auto  # auto = float32 on CPU, bfloat16 on GPU
    max_model_len: int = 2048  # prompt + response tokens per request
    gpu_memory_utilization: float = 0.3  # GPU: the share of device memory vLLM may use
    # CPU: vLLM's OpenMP threads (VLLM_CPU_OMP_THREADS_BIND): "nobind" = one per core, unpinned; a core
    # list ("0", "0-1") pins one thread per listed core. "0" on a 2-core host leaves a core to the env
    # actors and the learner (benchmarks/README.md: same env steps/s at 4 actors, 0.7 of the CPU; slower
    # with 1 actor)
    cpu_omp_threads_bind: str = "nobind"
    # CPU: host memory for the KV cache (1 GiB = ~23k tokens of the 135M model); vLLM's own CPU default
    # takes a share of all RAM per engine (OOM with two)
    cpu_kv_cache_gib: int = 1
    tensor_parallel_size: int = 1  # >1 needs as many GPUs (vLLM's native tensor parallelism)
    enforce_eager: bool = True  # CUDA graphs cost start-up time; worth it only on long GPU runs
    on_update: OnUpdate = OnUpdate.finish  # requests in flight at a weight update: finish | abort
    weight_staging_dir: str = "/dev/shm"  # where received weights are staged for the engine
    allowed_weight_dirs: list[str] = field(default_factory=lambda: ["/dev/shm"])  # WeightFile paths must lie here
    max_weight_message_bytes: int = 1 << 30  # size limit of one WeightChunk message
    max_request_message_bytes: int = 8 << 20  # size limit of any other request


@dataclass
class EnvActorConfig:
    index: int = 0  # this actor's number (set per process): its id and metrics port
    envs_per_actor: int = 1  # ScienceWorld envs (one JVM and one thread each) played concurrently by one process
    server_selection: ServerSelection = ServerSelection.least_loaded  # least_loaded | round_robin
    # The prompt (actors/prompts.py): the reference's, adapted from RLVMR. A system part (instructions,
    # the task, one expert demonstration, the env's action templates), then the episode as a chat.
    history_window: int = 0  # past turns shown: 0 = all (the reference), N = the last N
    # The prompt's token limit: 0 = policy_server.max_model_len - max_action_tokens. Past it the oldest
    # turns are left out first (the prompt says how many); the system part and the current turn stay.
    prompt_token_budget: int = 0
    demonstration: bool = True  # the gold action sequence of another training variation of the task
    demo_max_steps: int = 0  # the demonstration's first N actions; 0 = all of them
    max_action_tokens: int = 32  # generation cap for an action
    # Stop generating at the first newline: an action is one line, and a small model otherwise goes on
    # to write the next observation or more actions until the token cap, which costs generation time.
    # The reference stops only at the cap (32 tokens) and maps the whole text. The executed action
    # comes from the first line either way (unless a generation opens with a newline); the behaviour
    # tokens differ. The raw text is kept in Trajectory.generated_texts either way.
    stop_at_newline: bool = True
    temperature: float = 1.0  # sampling temperature in training (0.4 at evaluation)
    generate_timeout_s: float = 300.0  # one action generation; generous for CPU start-up
    memory_timeout_s: float = 5.0  # retrieval; after it, the turn goes without tips (counted)
    memory_retry_after_s: float = 30.0  # after a failed retrieval, go without tips at once for this long
    buffer_timeout_s: float = 30.0  # assignment request / trajectory upload, per try
    # after a generation timed out on a policy server (down or hung), requests go to the others for this long
    policy_retry_after_s: float = 60.0
    upload_retries: int = 20  # a finished episode is retried this often before the actor fails

    def prompt_budget(self, max_model_len: int) -> int:
        """Tokens an action prompt may take: prompt_token_budget, or what the policy server's
        context (policy_server.max_model_len) leaves after the action."""
        return self.prompt_token_budget or max_model_len - self.max_action_tokens
