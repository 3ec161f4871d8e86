"""The whole pipeline's configuration: one typed tree, the composition root above the roles.

Each role reads its own section (its dataclass lives in its package) plus the shared sections
defined here: `model`, `endpoints`, `metrics`, `env` (ScienceWorld episodes: env actors, replay
buffer, evaluation), `weight_sync` (learner and policy servers) and the top-level `seed`,
`run_dir`, `startup_timeout_s`.

The dataclasses hold every default (the paper's recipe); conf/pipeline.yaml only composes them
with a preset (conf/preset/) and a profile (conf/profile/: `cpu`, the default, is the small CPU
run of `make run`; `paper` the paper's setup). load_config validates the result before any
process starts: OmegaConf checks types and the choice fields (Enums), `validate` every
range and cross-section rule; a bad value raises one ConfigError naming the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from actors.env_actor.config import EnvActorConfig
from actors.policy_server.config import PolicyServerConfig
from common.choices import Choice
from common.model_prep import EMBEDDED_MODEL
from common.scienceworld import task_names
from deploy.config import LaunchConfig
from evaluation.config import EvalConfig, TestTimeAdaptationConfig
from learner.config import LearnerConfig
from memory_service.config import MemoryServiceConfig
from protocol.codec import DEFAULT_MAX_MESSAGE_BYTES
from protocol.messages import BATCH_ENVELOPE_BYTES, DoorLimits
from replay_buffer.config import ReplayBufferConfig


class ConfigError(ValueError):
    """A configuration refused at load; `key` names the offending key."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


@dataclass
class ModelConfig:
    name: str = EMBEDDED_MODEL  # an HF model directory, a hub name, or the embedded default
    cache_dir: str = ""  # where the embedded model is converted to; "" = ~/.cache/empo2


@dataclass
class EndpointsConfig:
    """Where each server binds and clients connect. Loopback by default; to span hosts, bind
    the server on tcp://0.0.0.0:PORT and point the clients at the server's address."""

    policy_servers: list[str] = field(default_factory=lambda: ["tcp://127.0.0.1:5550"])
    replay_buffer: str = "tcp://127.0.0.1:5560"
    memory_service: str = "tcp://127.0.0.1:5570"


# Prometheus ports, per role: (first port above metrics.base_port, how many). Disjoint ranges, so
# no count of servers, actors or learner ranks within them can collide.
METRICS_PORTS = {
    "policy_server": (0, 100),  # server i: base + i, i < 100
    "replay_buffer": (100, 1),  # base + 100
    "memory_service": (101, 1),  # base + 101
    "learner": (200, 100),  # torchrun rank r: base + 200 + r, r < 100
    "env_actor": (300, 700),  # actor j: base + 300 + j, j < 700
    "launch": (102, 1),  # base + 102: the supervising launcher (restarts, roles up)
    "evaluator": (103, 1),  # base + 103: the periodic evaluation (eval.every_steps)
}
METRICS_PORT_SPAN = 1000  # base_port .. base_port + 999


@dataclass
class MetricsConfig:
    """Prometheus /metrics, one port per process (METRICS_PORTS): with the default base 9100,
    policy server i on 9100+i, replay buffer 9200, memory service 9201, learner rank r on
    9300+r, env actor j on 9400+j, the launcher (empo2-run) on 9202."""

    host: str = "127.0.0.1"
    base_port: int = 9100

    def port(self, role: str, index: int = 0) -> int:
        first, count = METRICS_PORTS[role]
        if not 0 <= index < count:
            raise ConfigError("metrics", f"{role} {index} has no metrics port: at most {count} {role} processes")
        return self.base_port + first + index


# The reference wrapper's per-task step limits (empo2.md, "Reference experimental setup"); every other
# task: EnvConfig.max_steps (30).
REFERENCE_TASK_STEP_LIMITS = {
    "boil": 100,
    "change-the-state-of-matter-of": 80,
    "freeze": 80,
    "melt": 80,
    "measure-melting-point-known-substance": 120,
    "grow-fruit": 60,
    "chemistry-mix": 60,
}


@dataclass
class EnvConfig:
    """ScienceWorld episodes: read by the env actors, the replay buffer (variation lists) and
    the evaluation drivers."""

    simplification: str = "easy"  # ScienceWorld simplification preset (or a comma-separated list)
    max_steps: int = 30  # step limit per episode of a task not in max_steps_per_task (the reference's)
    # Per-task limits over max_steps: the reference wrapper's. A profile or an override changes one
    # (env.max_steps_per_task.boil=50) or adds one (+env.max_steps_per_task.find-plant=10); a map in a
    # profile merges with this one, so a profile that wants max_steps for every task sets
    # task_step_limits=false instead.
    max_steps_per_task: dict[str, int] = field(default_factory=lambda: dict(REFERENCE_TASK_STEP_LIMITS))
    task_step_limits: bool = True  # false: max_steps_per_task is ignored, every task plays max_steps
    # ScienceWorld's own step limit (envStepLimit): the env reports done once an episode has taken more
    # moves than this. The reference's 100; a task limit above it (measure-melting-point-known-substance,
    # 120) is cut there by the env, as in the reference.
    env_step_limit: int = 100

    def step_limit(self, task: str) -> int:
        """The number of turns an episode of `task` may take (the env may end it earlier)."""
        return self.task_limits().get(task, self.max_steps)

    def task_limits(self) -> dict[str, int]:
        """The per-task limits in force: max_steps_per_task, or none when task_step_limits is false."""
        return dict(self.max_steps_per_task) if self.task_step_limits else {}


class WeightSyncMethod(Choice):
    zmq = "zmq"  # WeightChunk frames over the servers' sockets (any host)
    shm = "shm"  # one safetensors file in weight_sync.shm_dir, announced by a WeightFile (one host)
    checkpoint = "checkpoint"  # the HF checkpoint written at each push (run_dir on a shared filesystem)
    nccl = "nccl"  # vLLM's NCCL weight transfer (GPU hosts; not with LoRA)


@dataclass
class WeightSyncConfig:
    """How the learner's new weights reach the policy servers: read by the learner and the
    servers alike (learner/weight_push.py, actors/policy_server/engine.py)."""

    method: WeightSyncMethod = WeightSyncMethod.zmq  # zmq | shm | checkpoint | nccl
    shm_dir: str = "/dev/shm"  # shm: where the weight file is written (must lie in policy_server.allowed_weight_dirs)
    nccl_address: str = "127.0.0.1"  # nccl: the learner's rendezvous address, reachable by the servers
    nccl_port: int = 29600  # nccl: rendezvous port of the first server's group (+i for server i)
    zmq_chunk_bytes: int = 64 << 20  # zmq: weight push message size (<= policy_server.max_weight_message_bytes)


# pipeline.mode: "async" (the default: actors play on while the learner steps, the system's design) or
# "sync" (the synchronous baseline: the same processes in lockstep; replay_buffer/buffer.py). A
# functional Enum, as "async" is a Python keyword (Choice members are named as their values).
PipelineMode = Choice("PipelineMode", {"async": "async", "sync": "sync"})


@dataclass
class PipelineModeConfig:
    """How rollouts and learner steps interleave; read by the replay buffer, which paces both."""

    # async: actors keep playing while the learner steps (staleness up to learner.max_staleness);
    # sync: the buffer hands out one batch of groups per policy version, and the next batch only once
    # the learner asks for a batch with the new version, i.e. after its step and weight push (staleness 0)
    mode: PipelineMode = PipelineMode["async"]


@dataclass
class SecurityConfig:
    """Who may talk to the servers and what they accept at the door (issue 14; README, Reliability):
    read by every role. Text bounds are per field, in characters; a longer one is refused."""

    # CURVE on every socket: servers accept only the client keys in keys_dir/authorized (ZAP), and
    # clients verify the server's key. `empo2-keys DIR` writes the keys (protocol/security.py).
    curve: bool = False
    keys_dir: str = "keys"  # curve: the directory `empo2-keys` wrote (relative to the working directory)
    # The replay buffer serves batches only to a BatchRequest carrying this token (the learner's).
    # Empty: empo2-run makes a random one per run for the buffer and learner it starts (pipeline/cli.py,
    # LEARNER_TOKEN_ENV); roles started otherwise (systemd, by hand) then check none unless it is set.
    learner_token: str = ""
    max_observation_len: int = 16384  # one observation of a Trajectory or EpisodeReport
    max_action_len: int = 1024  # one action
    max_state_len: int = 16384  # MemoryQuery.state: embedded on every query
    max_task_description_len: int = 4096  # EpisodeReport.task_description
    max_reflection_len: int = 4096  # a reflection the policy wrote is cut to this before it is stored
    # Bytes of episode reports waiting for reflection; past it reports are answered with Wait.
    max_reflection_queue_bytes: int = 256 << 20
    # Bytes of trajectories the buffer holds unserved (open and ready groups); past it no new group
    # is handed out (Wait), so actors slow down before the buffer's memory grows without bound.
    max_held_trajectory_bytes: int = 4 << 30


@dataclass
class PipelineConfig:
    run_dir: str = "runs/default"  # logs, checkpoints, buffer log and memory store of this run (conf: one per run)
    seed: int = 0
    startup_timeout_s: float = 900.0  # how long a client (actor, learner, evaluation) waits for its servers
    model: ModelConfig = field(default_factory=ModelConfig)
    endpoints: EndpointsConfig = field(default_factory=EndpointsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    policy_server: PolicyServerConfig = field(default_factory=PolicyServerConfig)
    env_actor: EnvActorConfig = field(default_factory=EnvActorConfig)
    replay_buffer: ReplayBufferConfig = field(default_factory=ReplayBufferConfig)
    memory_service: MemoryServiceConfig = field(default_factory=MemoryServiceConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    tta: TestTimeAdaptationConfig = field(default_factory=TestTimeAdaptationConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    pipeline: PipelineModeConfig = field(default_factory=PipelineModeConfig)

    def run_path(self, *parts: str) -> Path:
        path = Path(self.run_dir).joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def load_config(overrides: list[str] | None = None, config_name: str = "pipeline") -> PipelineConfig:
    """Compose conf/<config_name>.yaml with command-line style overrides into a validated
    PipelineConfig; raises ConfigError (key and problem) on anything it refuses.

    Every role's main calls this with sys.argv[1:], so `key=value` overrides work the same way
    for every process and for the launcher, which passes its own overrides down to its children.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    ConfigStore.instance().store(name="pipeline_schema", node=PipelineConfig)
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            composed = compose(config_name=config_name, overrides=list(overrides or []))
        cfg = OmegaConf.to_object(composed)
    except (HydraException, OmegaConfBaseException) as exc:
        raise _config_error(exc) from None
    validate(cfg)
    return cfg


def to_yaml(cfg: PipelineConfig, sections: tuple[str, ...] | None = None) -> str:
    """The configuration (or some of its top-level keys) as YAML, choices as their values."""
    from omegaconf import OmegaConf

    tree = OmegaConf.structured(cfg)
    if sections is not None:
        tree = OmegaConf.create({key: tree[key] for key in sections})
    return OmegaConf.to_yaml(tree)


def _config_error(exc: Exception) -> ConfigError:
    """Hydra's and OmegaConf's exceptions as one ConfigError: the key, the problem in one line."""
    missing = getattr(exc, "missing_cfg_file", None)  # hydra.errors.MissingConfigException: profile=nope
    if missing and "/" in missing:
        group, name = missing.rsplit("/", 1)
        return ConfigError(group, f"no {name!r} in conf/{group}/; one of {', '.join(exc.options or [])}")
    cause = exc
    while cause is not None and not getattr(cause, "full_key", None):
        cause = cause.__cause__
    if cause is not None:
        problem = str(getattr(cause, "msg", cause)).splitlines()[0]
        return ConfigError(cause.full_key, problem)
    lines = [line.strip() for line in str(exc).splitlines()]  # an override Hydra cannot parse
    lines = [line for line in lines if line and not line.startswith(("See https://", "^"))]
    return ConfigError("overrides", "; ".join(lines) or type(exc).__name__)


# ------------------------------------------------------------------------------ validation


def validate(cfg: PipelineConfig) -> None:
    """Every range and cross-section rule, checked at load (types and choices are OmegaConf's);
    the first one broken raises ConfigError naming its key. Device checks (is a GPU there?) are
    not config: the roles make them at start-up."""
    rb, lr, env, ws, ps, ea, mem = (
        cfg.replay_buffer,
        cfg.learner,
        cfg.env,
        cfg.weight_sync,
        cfg.policy_server,
        cfg.env_actor,
        cfg.memory_service,
    )

    def check(ok: bool, key: str, problem: str) -> None:
        if not ok:
            raise ConfigError(key, problem)

    def at_least(key: str, value: float, low: float) -> None:
        check(value >= low, key, f"must be >= {low}, got {value}")

    def within(key: str, value: float, low: float, high: float) -> None:
        check(low <= value <= high, key, f"must be in [{low}, {high}], got {value}")

    def fits_context(key: str, prompt_tokens: int, reply_key: str, reply_tokens: int) -> None:
        """A request's prompt budget and its generation cap fit the policy servers' context."""
        check(
            prompt_tokens >= 1 and prompt_tokens + reply_tokens <= ps.max_model_len,
            key,
            f"a prompt of {prompt_tokens} tokens and {reply_key} ({reply_tokens}) must fit "
            f"policy_server.max_model_len ({ps.max_model_len})",
        )

    # shared
    at_least("startup_timeout_s", cfg.startup_timeout_s, 0)
    check(bool(cfg.endpoints.policy_servers), "endpoints.policy_servers", "needs at least one server")
    at_least("env.max_steps", env.max_steps, 1)
    at_least("env.env_step_limit", env.env_step_limit, 1)
    for task, steps in env.max_steps_per_task.items():
        at_least(f"env.max_steps_per_task.{task}", steps, 1)

    known = task_names()
    for key, tasks in (
        ("replay_buffer.tasks", rb.tasks),
        ("tta.tasks", cfg.tta.tasks),
        ("env.max_steps_per_task", list(env.max_steps_per_task)),
        ("eval.tasks", cfg.eval.tasks),
        ("eval.subset_tasks", cfg.eval.subset_tasks),
    ):
        unknown = [t for t in tasks if known and t not in known]
        check(not unknown, key, f"not ScienceWorld tasks: {', '.join(unknown)}; the tasks are {', '.join(known)}")

    # replay buffer and the learner's batch
    check(bool(rb.tasks), "replay_buffer.tasks", "needs at least one ScienceWorld task")
    within("replay_buffer.p_memory", rb.p_memory, 0.0, 1.0)
    within("replay_buffer.q_off_policy", rb.q_off_policy, 0.0, 1.0)
    at_least("replay_buffer.variations_per_task", rb.variations_per_task, 1)
    check(rb.group_size >= 2, "replay_buffer.group_size", f"GRPO normalises within a group: >= 2, got {rb.group_size}")
    at_least("replay_buffer.max_open_groups", rb.max_open_groups, 1)
    at_least("learner.groups_per_step", lr.groups_per_step, 1)
    check(
        rb.max_ready_groups >= lr.groups_per_step,
        "replay_buffer.max_ready_groups",
        f"{rb.max_ready_groups} < learner.groups_per_step ({lr.groups_per_step}): "
        "the buffer would stop at fewer complete groups than a batch, and the learner wait forever",
    )
    at_least("replay_buffer.batch_poll_s", rb.batch_poll_s, 0)
    check(rb.assignment_timeout_s > 0, "replay_buffer.assignment_timeout_s", "must be > 0")
    check(rb.batch_confirm_timeout_s > 0, "replay_buffer.batch_confirm_timeout_s", "must be > 0")
    check(rb.group_commit_ms > 0, "replay_buffer.group_commit_ms", f"must be > 0, got {rb.group_commit_ms}")
    largest = DEFAULT_MAX_MESSAGE_BYTES - BATCH_ENVELOPE_BYTES
    check(
        0 < rb.max_trajectory_bytes <= largest,
        "replay_buffer.max_trajectory_bytes",
        f"must be in (0, {largest}] (a Batch the learner accepts, less its envelope), got {rb.max_trajectory_bytes}",
    )
    check(
        lr.max_staleness >= 0,
        "learner.max_staleness",
        f"a group is at least 0 versions old: >= 0, got {lr.max_staleness}",
    )

    # learner
    at_least("learner.total_steps", lr.total_steps, 0)
    check(lr.lr > 0, "learner.lr", f"must be > 0, got {lr.lr}")
    at_least("learner.warmup_steps", lr.warmup_steps, 0)
    check(
        0 <= lr.clip_low < 1, "learner.clip_low", f"the ratio is clipped at 1 - clip_low > 0: [0, 1), got {lr.clip_low}"
    )
    at_least("learner.clip_high", lr.clip_high, 0)
    check(lr.dual_clip > 1, "learner.dual_clip", f"the dual-clip constant must be > 1, got {lr.dual_clip}")
    check(lr.behaviour_weight_cap > 0, "learner.behaviour_weight_cap", "must be > 0")
    at_least("learner.micro_batch_tokens", lr.micro_batch_tokens, 1)
    at_least("learner.mini_batch_samples", lr.mini_batch_samples, 0)
    at_least("learner.update_epochs", lr.update_epochs, 1)
    check(lr.score_scale > 0, "learner.score_scale", f"the score's factor must be > 0, got {lr.score_scale}")
    at_least("learner.lora_rank", lr.lora_rank, 0)
    within("learner.gigpo_gamma", lr.gigpo_gamma, 0.0, 1.0)
    for name in ("rnd_feature_dim", "rnd_hidden", "rnd_output_dim"):
        at_least(f"learner.{name}", getattr(lr, name), 1)
    at_least("learner.rnd_updates", lr.rnd_updates, 0)
    at_least("learner.checkpoint_every", lr.checkpoint_every, 0)
    at_least("learner.keep_checkpoints", lr.keep_checkpoints, 1)
    check(lr.push_timeout_s > 0, "learner.push_timeout_s", "must be > 0")
    at_least("learner.push_attempts", lr.push_attempts, 1)
    at_least("learner.torch_threads", lr.torch_threads, 0)

    # weight sync: the learner's side and the servers' side must agree
    check(
        not (lr.lora_rank and ws.method == "nccl"),
        "weight_sync.method",
        "nccl is not for learner.lora_rank > 0: adapter-only LoRA pushes travel by zmq, shm or checkpoint",
    )
    for key, device in (("policy_server.device", ps.device), ("learner.device", lr.device)):
        check(
            not (ws.method == "nccl" and device == "cpu"),
            "weight_sync.method",
            f"nccl needs CUDA on both sides, and {key}=cpu; use zmq, shm or checkpoint on CPU hosts",
        )
    check(
        ws.zmq_chunk_bytes <= ps.max_weight_message_bytes,
        "weight_sync.zmq_chunk_bytes",
        f"{ws.zmq_chunk_bytes} > policy_server.max_weight_message_bytes ({ps.max_weight_message_bytes}): "
        "the servers would refuse every chunk",
    )
    at_least("weight_sync.zmq_chunk_bytes", ws.zmq_chunk_bytes, 1)
    if ws.method == "shm":
        shm = os.path.realpath(ws.shm_dir)
        allowed = [os.path.realpath(d) for d in ps.allowed_weight_dirs]
        check(
            any(shm == d or shm.startswith(d + os.sep) for d in allowed),
            "weight_sync.shm_dir",
            f"{ws.shm_dir} is outside policy_server.allowed_weight_dirs {ps.allowed_weight_dirs}: "
            "the servers would refuse the weight file",
        )

    # policy servers
    check(
        0 <= ps.index < len(cfg.endpoints.policy_servers),
        "policy_server.index",
        f"{ps.index} is not an index of endpoints.policy_servers ({len(cfg.endpoints.policy_servers)} entries)",
    )
    at_least("policy_server.tensor_parallel_size", ps.tensor_parallel_size, 1)
    check(
        not (ps.tensor_parallel_size > 1 and ps.device == "cpu"),
        "policy_server.tensor_parallel_size",
        "> 1 needs CUDA GPUs, and policy_server.device=cpu",
    )
    check(0 < ps.gpu_memory_utilization <= 1, "policy_server.gpu_memory_utilization", "must be in (0, 1]")
    at_least("policy_server.max_model_len", ps.max_model_len, 1)
    at_least("policy_server.cpu_kv_cache_gib", ps.cpu_kv_cache_gib, 1)

    # env actors
    at_least("env_actor.envs_per_actor", ea.envs_per_actor, 1)
    at_least("env_actor.history_window", ea.history_window, 0)
    at_least("env_actor.prompt_token_budget", ea.prompt_token_budget, 0)
    at_least("env_actor.demo_max_steps", ea.demo_max_steps, 0)
    fits_context(
        "env_actor.prompt_token_budget", ea.prompt_budget(ps.max_model_len), "max_action_tokens", ea.max_action_tokens
    )
    at_least("env_actor.max_action_tokens", ea.max_action_tokens, 1)
    at_least("env_actor.temperature", ea.temperature, 0)
    at_least("env_actor.upload_retries", ea.upload_retries, 1)
    for name in ("generate_timeout_s", "memory_timeout_s", "buffer_timeout_s"):
        check(getattr(ea, name) > 0, f"env_actor.{name}", "must be > 0")
    at_least("env_actor.memory_retry_after_s", ea.memory_retry_after_s, 0)
    at_least("env_actor.policy_retry_after_s", ea.policy_retry_after_s, 0)

    # memory service
    within("memory_service.similarity_threshold", mem.similarity_threshold, -1.0, 1.0)
    at_least("memory_service.top_k", mem.top_k, 1)
    at_least("memory_service.capacity", mem.capacity, 1)
    at_least("memory_service.reflection_steps_shown", mem.reflection_steps_shown, 0)
    at_least("memory_service.reflection_state_chars", mem.reflection_state_chars, 0)
    at_least("memory_service.reflection_prompt_tokens", mem.reflection_prompt_tokens, 0)
    at_least("memory_service.reflection_max_tokens", mem.reflection_max_tokens, 1)
    fits_context(
        "memory_service.reflection_prompt_tokens",
        mem.reflection_prompt_budget(ps.max_model_len),
        "reflection_max_tokens",
        mem.reflection_max_tokens,
    )
    at_least("memory_service.reflection_temperature", mem.reflection_temperature, 0)
    at_least("memory_service.reflection_batch_size", mem.reflection_batch_size, 1)
    at_least("memory_service.reflection_attempts", mem.reflection_attempts, 1)

    # launcher and evaluation
    at_least("launch.num_env_actors", cfg.launch.num_env_actors, 1)
    check(cfg.launch.timeout_s > 0, "launch.timeout_s", "must be > 0")
    at_least("launch.restart_budget", cfg.launch.restart_budget, 0)
    check(cfg.launch.restart_window_s > 0, "launch.restart_window_s", "must be > 0")
    at_least("launch.backoff_s", cfg.launch.backoff_s, 0)
    at_least("launch.backoff_max_s", cfg.launch.backoff_max_s, cfg.launch.backoff_s)
    check(bool(cfg.tta.tasks), "tta.tasks", "needs at least one task")
    at_least("tta.variations", cfg.tta.variations, 1)
    at_least("tta.trials", cfg.tta.trials, 1)
    at_least("tta.temperature", cfg.tta.temperature, 0)
    check(bool(cfg.eval.policy), "eval.policy", "base, latest or a checkpoint directory")
    at_least("eval.variations", cfg.eval.variations, 1)
    at_least("eval.episodes", cfg.eval.episodes, 1)
    at_least("eval.temperature", cfg.eval.temperature, 0)
    at_least("eval.envs", cfg.eval.envs, 1)
    at_least("eval.every_steps", cfg.eval.every_steps, 0)
    at_least("eval.subset_variations", cfg.eval.subset_variations, 1)
    if cfg.eval.every_steps:
        every, ckpt = cfg.eval.every_steps, lr.checkpoint_every
        check(
            ckpt > 0 and every % ckpt == 0,
            "eval.every_steps",
            f"{every} must be a multiple of learner.checkpoint_every ({ckpt}): it scores those checkpoints",
        )
        check(cfg.eval.checkpoint_poll_s > 0, "eval.checkpoint_poll_s", "must be > 0")
        eval_low = cfg.eval.metrics_base_port
        check(
            1024 <= eval_low <= 65535 - METRICS_PORT_SPAN
            and (
                eval_low + METRICS_PORT_SPAN <= cfg.metrics.base_port
                or eval_low >= cfg.metrics.base_port + METRICS_PORT_SPAN
            ),
            "eval.metrics_base_port",
            f"its block {eval_low}..{eval_low + METRICS_PORT_SPAN - 1} must lie in 1024..65535, apart from metrics.base_port's",
        )
        check(
            cfg.eval.server_endpoint not in cfg.endpoints.policy_servers,
            "eval.server_endpoint",
            "is one of endpoints.policy_servers: the periodic evaluation serves its checkpoint on its own",
        )

    # security: text bounds and queue sizes
    for name in (
        "max_observation_len",
        "max_action_len",
        "max_state_len",
        "max_task_description_len",
        "max_reflection_len",
        "max_reflection_queue_bytes",
        "max_held_trajectory_bytes",
    ):
        at_least(f"security.{name}", getattr(cfg.security, name), 1)
    check(
        bool(cfg.security.keys_dir) or not cfg.security.curve,
        "security.keys_dir",
        "security.curve=true needs the directory empo2-keys wrote",
    )

    _check_ports(cfg)


def door_limits(cfg: PipelineConfig, vocab_size: int = 0) -> DoorLimits:
    """What the servers check every message against (protocol.messages.DoorLimits): the run's tasks
    (training and evaluation), the longest episode the env config allows, the text bounds of
    `security`, and the model's vocabulary size where the server knows it (0: not checked)."""
    sec = cfg.security
    return DoorLimits(
        vocab_size=vocab_size,
        tasks=frozenset([*cfg.replay_buffer.tasks, *cfg.tta.tasks]),
        max_turns=max([cfg.env.max_steps, *cfg.env.task_limits().values()]),
        max_observation_len=sec.max_observation_len,
        max_action_len=sec.max_action_len,
        max_state_len=sec.max_state_len,
        max_task_description_len=sec.max_task_description_len,
    )


def _check_ports(cfg: PipelineConfig) -> None:
    """Every process's metrics port exists (the counts fit their ranges, METRICS_PORTS), lies in
    the valid port range, and no endpoint or NCCL rendezvous port on the metrics host falls into
    the metrics block."""
    m = cfg.metrics
    low, high = m.base_port, m.base_port + METRICS_PORT_SPAN - 1
    if not (1024 <= low and high <= 65535):
        raise ConfigError("metrics.base_port", f"the metrics ports {low}..{high} must lie in 1024..65535")
    for key, role, count in (
        ("endpoints.policy_servers", "policy_server", len(cfg.endpoints.policy_servers)),
        ("launch.num_env_actors", "env_actor", cfg.launch.num_env_actors),
        ("env_actor.index", "env_actor", cfg.env_actor.index + 1),
    ):
        if count > METRICS_PORTS[role][1]:
            raise ConfigError(
                key, f"at most {METRICS_PORTS[role][1]} {role} processes have a metrics port, got {count}"
            )
    if cfg.env_actor.index < 0:
        raise ConfigError("env_actor.index", f"must be >= 0, got {cfg.env_actor.index}")
    used = [(f"endpoints.policy_servers[{i}]", ep) for i, ep in enumerate(cfg.endpoints.policy_servers)]
    used += [
        ("endpoints.replay_buffer", cfg.endpoints.replay_buffer),
        ("endpoints.memory_service", cfg.endpoints.memory_service),
    ]
    addresses = {key: _tcp_address(key, ep) for key, ep in used}
    if cfg.weight_sync.method == "nccl":
        for i in range(len(cfg.endpoints.policy_servers)):
            addresses[f"weight_sync.nccl_port (+{i})"] = (cfg.weight_sync.nccl_address, cfg.weight_sync.nccl_port + i)
    seen: dict[tuple[str, int], str] = {}
    for key, address in addresses.items():
        if address is None:
            continue
        if low <= address[1] <= high:
            raise ConfigError(key, f"port {address[1]} lies in the metrics ports {low}..{high} (metrics.base_port)")
        if address in seen:
            raise ConfigError(key, f"{address[0]}:{address[1]} is also {seen[address]}")
        seen[address] = key


def _tcp_address(key: str, endpoint: str) -> tuple[str, int] | None:
    """(host, port) of a ZeroMQ tcp:// endpoint; None for ipc:// and other transports."""
    url = urlparse(endpoint)
    if url.scheme != "tcp":
        return None
    try:
        port = url.port
    except ValueError:
        port = None
    if port is None:
        raise ConfigError(key, f"{endpoint!r} has no valid port")
    return url.hostname or "", port
