"""The sections every role may be given besides its own (`model`, `endpoints`, `metrics`, `env`,
`weight_sync`, `security`, `pipeline`), the run-wide facts pipeline/ derives once for the roles
(RunFacts), and the helpers each section's `validate()` checks its ranges with.

A section's validate() raises ConfigError with the key inside the section ("lr"); pipeline/config.py
validates every section of the tree and names the whole key ("learner.lr"). Rules that join two
sections live there too, and only there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from common.choices import Choice
from common.model_prep import EMBEDDED_MODEL
from common.scienceworld import task_names
from protocol.messages import MAX_REFLECTED_STRATEGIES, DoorLimits


class ConfigError(ValueError):
    """A configuration refused at load; `key` names the offending key."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


def check(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(key, problem)


def at_least(key: str, value: float, low: float) -> None:
    check(value >= low, key, f"must be >= {low}, got {value}")


def positive(key: str, value: float) -> None:
    check(value > 0, key, f"must be > 0, got {value}")


def within(key: str, value: float, low: float, high: float) -> None:
    check(low <= value <= high, key, f"must be in [{low}, {high}], got {value}")


def gpu_list(key: str, ids: list[int], device: str) -> int:
    """A process's GPUs by device number ([2, 3]; [] = every GPU the host shows), as its
    CUDA_VISIBLE_DEVICES will name them: refused unless distinct and >= 0, and with device=cpu; how many."""
    if not ids:
        return 0
    check(all(i >= 0 for i in ids), key, f"{list(ids)}: device numbers are >= 0")
    check(len(set(ids)) == len(ids), key, f"{list(ids)} names a device twice")
    check(device != "cpu", key, f"{list(ids)} names GPUs, and the process's device is cpu")
    return len(ids)


def scienceworld_tasks(key: str, tasks: list[str]) -> None:
    """Every name is a ScienceWorld task (not checked where ScienceWorld is not installed)."""
    known = task_names()
    unknown = [t for t in tasks if known and t not in known]
    check(not unknown, key, f"not ScienceWorld tasks: {', '.join(unknown)}; the tasks are {', '.join(known)}")


@dataclass
class ModelConfig:
    name: str = EMBEDDED_MODEL  # an HF model directory, a hub name, or the embedded default
    cache_dir: str = ""  # where the embedded model is converted to; "" = ~/.cache/empo2


@dataclass
class EndpointsConfig:
    """Where each server binds and clients connect. Loopback by default; to span hosts, bind
    the server on tcp://0.0.0.0:PORT and point the clients at the server's address."""

    policy_servers: list[str] = field(default_factory=lambda: ["tcp://127.0.0.1:5550"])  # one server process each
    replay_buffer: str = "tcp://127.0.0.1:5560"  # the replay buffer's ROUTER
    memory_service: str = "tcp://127.0.0.1:5570"  # the memory service's ROUTER
    # "": a server binds its endpoint as written. A host (0.0.0.0): it binds that host at its endpoint's
    # port, while clients connect to the endpoint as written: one configuration for every process of a
    # deployment whose endpoints are DNS names (Kubernetes' headless Services, deploy/kubernetes.py)
    bind_host: str = ""

    def validate(self) -> None:
        check(bool(self.policy_servers), "policy_servers", "needs at least one server")

    def bind_address(self, endpoint: str) -> str:
        """What the server of `endpoint` binds: the endpoint, or bind_host at its port."""
        if not self.bind_host:
            return endpoint
        return f"tcp://{self.bind_host}:{endpoint.rsplit(':', 1)[1]}"


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

    host: str = "127.0.0.1"  # where every /metrics page listens (0.0.0.0 for a Prometheus on another host)
    base_port: int = 9100  # the first of METRICS_PORT_SPAN ports, laid out per role by METRICS_PORTS
    # true: process i of a kind serves on its kind's first port + i (processes sharing a host); false: every
    # process of a kind on its kind's first port (one address per process: a container's, Kubernetes)
    index_ports: bool = True

    def port(self, role: str, index: int = 0) -> int:
        first, count = METRICS_PORTS[role]
        if not 0 <= index < count:
            raise ConfigError("metrics", f"{role} {index} has no metrics port: at most {count} {role} processes")
        return self.base_port + first + (index if self.index_ports else 0)

    def validate(self) -> None:
        low, high = self.base_port, self.base_port + METRICS_PORT_SPAN - 1
        check(1024 <= low and high <= 65535, "base_port", f"the metrics ports {low}..{high} must lie in 1024..65535")


# The reference wrapper's per-task step limits (docs/method.md, "Reference experimental setup"); every other
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
    # The JVM's heap cap per ScienceWorld env (-Xmx through JAVA_TOOL_OPTIONS; 0 = the JVM's default, a
    # quarter of the host's memory). Uncapped, an env actor's JVM grew 1254 -> 2246 MB in a 5-minute
    # chaos run; capped at 384 MB, 600 steps over five tasks held it at ~480 MB and played no slower.
    jvm_max_heap_mb: int = 512

    def step_limit(self, task: str) -> int:
        """The number of turns an episode of `task` may take (the env may end it earlier)."""
        return self.task_limits().get(task, self.max_steps)

    def task_limits(self) -> dict[str, int]:
        """The per-task limits in force: max_steps_per_task, or none when task_step_limits is false."""
        return dict(self.max_steps_per_task) if self.task_step_limits else {}

    def max_turns(self) -> int:
        """The longest episode this section allows, over every task."""
        return max([self.max_steps, *self.task_limits().values()])

    def validate(self) -> None:
        at_least("max_steps", self.max_steps, 1)
        at_least("env_step_limit", self.env_step_limit, 1)
        at_least("jvm_max_heap_mb", self.jvm_max_heap_mb, 0)
        for task, steps in self.max_steps_per_task.items():
            at_least(f"max_steps_per_task.{task}", steps, 1)
        scienceworld_tasks("max_steps_per_task", list(self.max_steps_per_task))


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

    def validate(self) -> None:
        at_least("zmq_chunk_bytes", self.zmq_chunk_bytes, 1)


# pipeline.mode: "async" (the default: actors play on while the learner steps, the system's design) or
# "sync" (the synchronous baseline: the same processes in lockstep; replay_buffer/buffer.py). A
# functional Enum, as "async" is a Python keyword (Choice members are named as their values).
PipelineMode = Choice("PipelineMode", {"async": "async", "sync": "sync"})


@dataclass
class PipelineModeConfig:
    """How rollouts and learner steps interleave: `mode` is read by the replay buffer, which paces
    both; `rollout_nice` by each rollout process at its start (pipeline/cli.py)."""

    # async: actors keep playing while the learner steps (staleness up to learner.max_staleness);
    # sync: the buffer hands out one batch of groups per policy version, and the next batch only once
    # the learner asks for a batch with the new version, i.e. after its step and weight push (staleness 0)
    mode: PipelineMode = PipelineMode["async"]
    # The CPU niceness (0-19) of the rollout side (policy servers, env actors, memory service: the
    # roles with Role.rollout) where it shares cores with the learner. 0: a fair share each. Above 0
    # the learner takes the cores first and the rollouts fill its idle time: as many learner steps per
    # hour or more, fewer CPU seconds per step, fresher trained turns (benchmarks/async_vs_sync.py; the
    # CPU profile sets 10). No effect on stages that do not overlap (sync mode).
    rollout_nice: int = 0

    def validate(self) -> None:
        check(0 <= self.rollout_nice <= 19, "rollout_nice", "a niceness in 0..19 (higher: less CPU beside the learner)")


@dataclass
class TrackingConfig:
    """Experiment tracking (common/tracking.py): the run's metrics log (learner steps, evaluations) and
    the launcher's rollout counts sent to each backend named, with the run's configuration and git
    commit. Off by default; the libraries are the optional extra `tracking`."""

    BACKENDS: ClassVar[tuple[str, ...]] = ("tensorboard", "mlflow", "wandb")
    WANDB_MODES: ClassVar[tuple[str, ...]] = ("offline", "online")
    backends: list[str] = field(default_factory=list)  # any of BACKENDS, several at once; [] = none
    dir: str = ""  # where the backends write; "" = <run_dir>/tracking
    mlflow_uri: str = ""  # an MLflow server or store; "" = the SQLite store <dir>/mlflow.db (offline)
    experiment: str = "empo2"  # the MLflow experiment, and the W&B project, the run is filed under
    # offline: a run directory under <dir>/wandb that `wandb sync` uploads later; online: streamed to
    # W&B as the run goes (WANDB_API_KEY, or `wandb login`, in the launcher's environment)
    wandb_mode: str = "offline"

    def validate(self) -> None:
        unknown = [b for b in self.backends if b not in self.BACKENDS]
        check(not unknown, "backends", f"{unknown} unknown; choose from {list(self.BACKENDS)}")
        check(len(set(self.backends)) == len(self.backends), "backends", "names a backend twice")
        check(
            self.wandb_mode in self.WANDB_MODES, "wandb_mode", f"{self.wandb_mode!r}: one of {list(self.WANDB_MODES)}"
        )


@dataclass
class SecurityConfig:
    """Who may talk to the servers and what they accept at the door (issue 14; docs/reliability.md):
    read by every role. Text bounds are per field, in characters; a longer one is refused."""

    # CURVE on every socket: servers accept only the client keys in keys_dir/authorized (ZAP), and
    # clients verify the server's key. `empo2-keys DIR` writes the keys (protocol/security.py).
    curve: bool = False
    keys_dir: str = "keys"  # curve: the directory `empo2-keys` wrote (relative to the working directory)
    # The replay buffer serves batches only to a BatchRequest carrying this token (the learner's).
    # Empty: empo2-run makes a random one per run for the buffer and learner it starts, and
    # deploy/systemd/install.sh writes one into the units' environment file; either reaches the roles
    # as EMPO2_LEARNER_TOKEN (pipeline/cli.py, LEARNER_TOKEN_ENV).
    learner_token: str = ""
    # A buffer with neither CURVE nor a learner token refuses every BatchRequest (not_learner) and says
    # at start-up how to configure one; true: it serves batches to any client that reaches it instead
    # (a lone buffer in a test or a benchmark). Ignored when either is configured.
    insecure: bool = False
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

    def validate(self) -> None:
        for name in (
            "max_observation_len",
            "max_action_len",
            "max_state_len",
            "max_task_description_len",
            "max_reflection_len",
            "max_reflection_queue_bytes",
            "max_held_trajectory_bytes",
        ):
            at_least(name, getattr(self, name), 1)
        check(
            bool(self.keys_dir) or not self.curve,
            "keys_dir",
            "security.curve=true needs the directory empo2-keys wrote",
        )


@dataclass(frozen=True)
class RunFacts:
    """What a role is told about the run beyond its own sections: the shared settings, and the few
    facts that come from other roles' sections, derived once by pipeline/config.py (run_facts) so no
    role reads another role's section."""

    run_dir: str = "runs/default"
    seed: int = 0
    startup_timeout_s: float = 900.0  # how long a client waits for its servers
    model: ModelConfig = field(default_factory=ModelConfig)
    endpoints: EndpointsConfig = field(default_factory=EndpointsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    sync: bool = False  # pipeline.mode=sync: the lockstep baseline
    memory_in_use: bool = True  # replay_buffer.p_memory > 0: some rollouts read tips (GRPO: none do)
    max_model_len: int = 2048  # policy_server.max_model_len: the context every prompt must fit
    server_tensor_parallel_size: int = 1  # policy_server.tensor_parallel_size: the ranks of a server's NCCL group
    groups_per_step: int = 16  # learner.groups_per_step: a batch (the buffer's lockstep in sync mode)
    total_steps: int = 3  # learner.total_steps: the last policy version of the run
    # what the servers check at the door (their model's vocabulary they add themselves); default: nothing
    door: DoorLimits = field(default_factory=lambda: DoorLimits(0, frozenset(), 0, 0, 0, 0, 0))
    metrics_port: int = 0  # this process's Prometheus port (pipeline/roles.py; 0: none)
    # this process's heartbeat file (common/heartbeat.py), <run_dir>/heartbeats/<its name>; "": none
    heartbeat_path: str = ""

    def run_path(self, *parts: str) -> Path:
        return run_path(self.run_dir, *parts)


def run_path(run_dir: str, *parts: str) -> Path:
    """A path in the run directory, its parent made (RunFacts.run_path, PipelineConfig.run_path)."""
    path = Path(run_dir).joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class SgeConfig:
    """SGE (Strategy-Guided Exploration, Szot et al., arXiv 2603.02045; no public code): at the turns
    due, the policy first writes a <strategy>, sampled at the member's strategy temperature, then the
    action at the usual temperature, conditioned on it (actors/env_actor/strategy.py); a group's
    members spread their strategy temperatures over [strategy_temperature_min, _max] (the replay
    buffer's assignments); the memory service keeps every episode's opening strategy with its score
    and shows a new group the best and the most recent ones (the reflection, the same for every member).
    The paper's numbers for these keys were not readable (docs/methods.md): each is a choice, said so
    there. The env actor, the replay buffer and the memory service read this section."""

    enabled: bool = False  # preset=sge / empo2_sge
    # a strategy at turn 0 and then every N turns (1: every turn, "at each decision step"; 0: only at turn 0)
    replan_every: int = 1
    max_strategy_tokens: int = 48  # a strategy's generation cap (a cut one is closed by the actor)
    strategy_temperature_min: float = 0.6  # slot 0 of a group
    strategy_temperature_max: float = 1.4  # slot G-1; the others evenly between
    reflection: bool = True  # show a group the earlier strategies of its task with their scores
    reflection_best: int = 2  # the best-scoring earlier strategies shown
    reflection_recent: int = 2  # and the most recent others

    def strategy_temperature(self, slot: int, group_size: int) -> float:
        """The strategy temperature of member `slot` of a group of `group_size`: evenly spread."""
        lo, hi = self.strategy_temperature_min, self.strategy_temperature_max
        return lo if group_size <= 1 else lo + (hi - lo) * slot / (group_size - 1)

    def strategy_due(self, turn: int) -> bool:
        return turn == 0 or self.replan_every > 0 and turn % self.replan_every == 0

    def validate(self) -> None:
        at_least("replan_every", self.replan_every, 0)
        at_least("max_strategy_tokens", self.max_strategy_tokens, 1)
        within("strategy_temperature_min", self.strategy_temperature_min, 0.0, 10.0)
        within("strategy_temperature_max", self.strategy_temperature_max, self.strategy_temperature_min, 10.0)
        at_least("reflection_best", self.reflection_best, 0)
        at_least("reflection_recent", self.reflection_recent, 0)
        check(
            self.reflection_best + self.reflection_recent <= MAX_REFLECTED_STRATEGIES,
            "reflection_best",
            f"at most {MAX_REFLECTED_STRATEGIES} strategies in a reflection (reflection_best + reflection_recent)",
        )


class TrainContext(Choice):
    """What a HeRL revision is trained on (herl.train_context)."""

    guided = "guided"  # the prompt it was played with, the guidance in it (the reference's scripts)
    stripped = "stripped"  # the guidance removed, as EMPO2 removes tips off-policy


@dataclass
class HerlConfig:
    """HeRL (Hindsight experience guided RL, arXiv 2603.20046; its released code, sikelifei/HeRL): a
    complete group none of whose members solved the task is held while its tied-best members are
    replayed with guidance (what they achieved and missed: ScienceWorld's subgoals), the best revision
    takes one slot, and each revised member's reward moves towards its revision's
    (replay_buffer/hindsight.py); the learner trains the revision's tokens as hindsight tokens
    (learner/loss.py). The replay buffer and the learner read this section."""

    enabled: bool = False  # preset=herl / empo2_herl
    max_candidates: int = 16  # revisions per group at most (the reference's 16)
    alpha: float = 0.05  # the improvement bonus: r' = r + alpha (r_guided - r)
    gamma: float = 1.0  # hindsight tokens: w = rho / (rho + gamma), unclipped (1: their instruction-following runs)
    temperature: float = 0.3  # the guided episodes' sampling temperature (the reference's)
    train_context: TrainContext = TrainContext.guided  # guided (the reference) | stripped (guidance cut out, as tips)
    guided_timeout_s: float = 1800.0  # a group waits this long for its revisions, then goes on without them

    def validate(self) -> None:
        at_least("max_candidates", self.max_candidates, 1)
        within("alpha", self.alpha, 0.0, 1.0)
        positive("gamma", self.gamma)
        within("temperature", self.temperature, 0.0, 10.0)
        positive("guided_timeout_s", self.guided_timeout_s)
