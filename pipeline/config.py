"""The whole pipeline's configuration: one typed tree, composed here and nowhere else.

Each section is a dataclass in the package that uses it (learner/config.py, ...); the shared
sections (`model`, `endpoints`, `metrics`, `env`, `weight_sync`, `security`, `pipeline`) are in
common/config.py. Each section checks its own ranges (its validate()); this module adds the rules
that join sections, and derives once the run-wide facts a role is given beside its own sections
(run_facts -> common.config.RunFacts), so no role reads another role's section.

The dataclasses hold every default (the paper's recipe); conf/pipeline.yaml only composes them
with a preset (conf/preset/) and a profile (conf/profile/: `cpu`, the default, is the small CPU
run of `make run`; `paper` the paper's setup). load_config validates the result before any
process starts: OmegaConf checks types and the choice fields (Enums), `validate` every range and
cross-section rule; a bad value raises one ConfigError naming the key. A key the schema does not have
is refused too, also when added with `+key=value` or `++key=value` (Hydra adds those to the tree, and
OmegaConf's conversion to the dataclasses would drop them), naming the nearest keys it does have.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from urllib.parse import urlparse

from actors.env_actor.config import EnvActorConfig
from actors.policy_server.config import PolicyServerConfig
from common.config import (
    METRICS_PORT_SPAN,
    METRICS_PORTS,
    ConfigError,
    EndpointsConfig,
    EnvConfig,
    HerlConfig,
    MetricsConfig,
    ModelConfig,
    PipelineModeConfig,
    RunFacts,
    SecurityConfig,
    SgeConfig,
    TrackingConfig,
    WeightSyncConfig,
    at_least,
    check,
    run_path,
)
from deploy.config import LaunchConfig
from evaluation.config import EvalConfig, TestTimeAdaptationConfig
from learner.config import LearnerConfig
from memory_service.config import MemoryServiceConfig
from protocol.messages import DoorLimits
from replay_buffer.config import ReplayBufferConfig
from spa.config import SpaConfig


@dataclass
class PipelineConfig:
    run_dir: str = "runs/default"  # logs, checkpoints, buffer log and memory store of this run (conf: one per run)
    seed: int = 0  # the run's seed: each role derives its own streams from it (episodes, shuffles, sampling)
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
    herl: HerlConfig = field(default_factory=HerlConfig)
    sge: SgeConfig = field(default_factory=SgeConfig)
    spa: SpaConfig = field(default_factory=SpaConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def run_path(self, *parts: str) -> Path:
        return run_path(self.run_dir, *parts)


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
        unknown = _unknown_keys(composed)
        if unknown:
            raise ConfigError(unknown[0], f"not a key of the configuration{_did_you_mean(unknown[0])}")
        cfg = OmegaConf.to_object(composed)
    except (HydraException, OmegaConfBaseException) as exc:
        raise _config_error(exc) from None
    validate(cfg)
    return cfg


def to_dict(cfg: PipelineConfig) -> dict:
    """The configuration as plain containers, choices as their values (what <run_dir>/launch/config.json keeps)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)


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
        if isinstance(cause, KeyError | AttributeError):  # ConfigKeyError, ConfigAttributeError: no such key
            problem += _did_you_mean(cause.full_key)
        return ConfigError(cause.full_key, problem)
    lines = [line.strip() for line in str(exc).splitlines()]  # an override Hydra cannot parse
    lines = [line for line in lines if line and not line.startswith(("See https://", "^"))]
    return ConfigError("overrides", "; ".join(lines) or type(exc).__name__)


def _unknown_keys(node, prefix: str = "") -> list[str]:
    """The dotted keys of a composed tree that its schema does not have: keys of a section (a
    dataclass node) that are not its fields, as `+key=value` and `++key=value` add them. A map field
    (a dict, e.g. env.max_steps_per_task) takes any key."""
    from omegaconf import DictConfig, OmegaConf

    schema = OmegaConf.get_type(node)
    names = {f.name for f in fields(schema)} if is_dataclass(schema) else None
    unknown = []
    for key in node.keys():
        dotted = f"{prefix}{key}"
        child = node._get_node(key)
        if names is not None and key not in names:
            unknown.append(dotted)
        elif isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            unknown += _unknown_keys(child, f"{dotted}.")
    return unknown


def schema_keys() -> list[str]:
    """Every dotted key of the configuration: each section and each of its keys (a map field's
    default keys included), e.g. learner, learner.lr, env.max_steps_per_task.boil."""
    from omegaconf import DictConfig, OmegaConf

    def walk(node: DictConfig, prefix: str) -> list[str]:
        keys = []
        for key in node.keys():
            dotted = f"{prefix}{key}"
            keys.append(dotted)
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
                keys += walk(child, f"{dotted}.")
        return keys

    return walk(OmegaConf.structured(PipelineConfig), "")


def _did_you_mean(key: str) -> str:
    """'; did you mean learner.lr?': the schema's keys nearest to an unknown `key` (difflib), those
    of its own section first (learner.lrr: learner.lr), else the same name in another section
    (learner.top_k: memory_service.top_k); '' when none is near."""
    parent, _, name = key.rpartition(".")
    keys = schema_keys()
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent]
    near = [f"{parent}.{k}" if parent else k for k in difflib.get_close_matches(name, siblings, n=3, cutoff=0.6)]
    if not near:
        by_name = {}
        for k in keys:
            by_name.setdefault(k.rpartition(".")[2], []).append(k)
        near = [k for n in difflib.get_close_matches(name, list(by_name), n=3, cutoff=0.8) for k in by_name[n]][:3]
    return f"; did you mean {' or '.join(near)}?" if near else ""


# ------------------------------------------------------------------------------ validation


def validate(cfg: PipelineConfig) -> None:
    """Every section's own ranges (its validate()), then the rules that join sections; the first
    one broken raises ConfigError naming its key. Types and choices are OmegaConf's; device checks
    (is a GPU there?) are not config: the roles make them at start-up."""
    at_least("startup_timeout_s", cfg.startup_timeout_s, 0)
    for f in fields(cfg):
        section = getattr(cfg, f.name)
        if hasattr(section, "validate"):
            try:
                section.validate()
            except ConfigError as exc:
                raise ConfigError(f"{f.name}.{exc.key}", exc.problem) from None
    _cross_section_rules(cfg)
    _check_ports(cfg)


def _cross_section_rules(cfg: PipelineConfig) -> None:
    """What no section can check alone: the learner's batch against the buffer, the servers'
    context against the prompts, both ends of the weight sync, the periodic evaluation's server and
    checkpoints."""
    rb, lr, ws, ps, ev = cfg.replay_buffer, cfg.learner, cfg.weight_sync, cfg.policy_server, cfg.eval
    check(
        rb.max_ready_groups >= lr.groups_per_step,
        "replay_buffer.max_ready_groups",
        f"{rb.max_ready_groups} < learner.groups_per_step ({lr.groups_per_step}): "
        "the buffer would stop at fewer complete groups than a batch, and the learner wait forever",
    )
    check(
        not lr.gpus or len(lr.gpus) >= cfg.launch.learner_ranks,
        "learner.gpus",
        f"{list(lr.gpus)} has fewer devices than launch.learner_ranks ({cfg.launch.learner_ranks}), one per rank",
    )
    check(
        not ps.gpus or len(ps.gpus) == len(cfg.endpoints.policy_servers),
        "policy_server.gpus",
        f"{len(ps.gpus)} entries for {len(cfg.endpoints.policy_servers)} endpoints.policy_servers: one per server, or []",
    )
    check(
        ps.index < len(cfg.endpoints.policy_servers),
        "policy_server.index",
        f"{ps.index} is not an index of endpoints.policy_servers ({len(cfg.endpoints.policy_servers)} entries)",
    )
    for key, prompt_tokens, reply_key, reply_tokens in (
        (
            "env_actor.prompt_token_budget",
            cfg.env_actor.prompt_budget(ps.max_model_len),
            "max_action_tokens",
            cfg.env_actor.max_action_tokens,
        ),
        (
            "memory_service.reflection_prompt_tokens",
            cfg.memory_service.reflection_prompt_budget(ps.max_model_len),
            "reflection_max_tokens",
            cfg.memory_service.reflection_max_tokens,
        ),
    ):
        check(
            prompt_tokens >= 1 and prompt_tokens + reply_tokens <= ps.max_model_len,
            key,
            f"a prompt of {prompt_tokens} tokens and {reply_key} ({reply_tokens}) must fit "
            f"policy_server.max_model_len ({ps.max_model_len})",
        )

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
    if ws.method == "shm":
        shm = os.path.realpath(ws.shm_dir)
        allowed = [os.path.realpath(d) for d in ps.allowed_weight_dirs]
        check(
            any(shm == d or shm.startswith(d + os.sep) for d in allowed),
            "weight_sync.shm_dir",
            f"{ws.shm_dir} is outside policy_server.allowed_weight_dirs {ps.allowed_weight_dirs}: "
            "the servers would refuse the weight file",
        )

    # off loopback: without CURVE any host that reaches a server could push weights to it, add trajectories
    # to the buffer or episode reports to the memory (whose tips the policy reads); only batches need a token
    exposed = sorted(off_loopback(cfg))
    check(
        not exposed or cfg.security.curve or cfg.security.insecure,
        "security.curve",
        f"servers bind {', '.join(exposed)} (off loopback) without CURVE: turn it on (`empo2-keys DIR`, then "
        "security.curve=true security.keys_dir=DIR; empo2-slurm does both), or accept any client that reaches them "
        "with security.insecure=true",
    )

    # leases: a live actor renews its slot several times within the buffer's TTL
    check(
        3 * cfg.env_actor.lease_renew_s <= rb.lease_ttl_s,
        "env_actor.lease_renew_s",
        f"{cfg.env_actor.lease_renew_s} must be at most a third of replay_buffer.lease_ttl_s ({rb.lease_ttl_s}): "
        "a live actor's slot would lapse after one or two slow renewals",
    )

    # hang detection: a role waiting on a hung peer retries after these timeouts and beats per
    # attempt (common/heartbeat.py); a limit under one would restart the waiting role, not the peer
    hang = cfg.launch.hang_timeout_s
    for key, wait_s in (
        ("learner.push_timeout_s", lr.push_timeout_s),
        ("env_actor.generate_timeout_s", cfg.env_actor.generate_timeout_s),
        ("env_actor.buffer_timeout_s", cfg.env_actor.buffer_timeout_s),
    ):
        check(
            not hang or hang > wait_s,
            "launch.hang_timeout_s",
            f"{hang} must exceed {key} ({wait_s}) or be 0 (off): a role waiting on a hung peer would be "
            "taken for hung itself",
        )

    if ev.every_steps:  # the periodic evaluation scores the learner's checkpoints on its own server
        check(
            lr.checkpoint_every > 0 and ev.every_steps % lr.checkpoint_every == 0,
            "eval.every_steps",
            f"{ev.every_steps} must be a multiple of learner.checkpoint_every ({lr.checkpoint_every}): "
            "it scores those checkpoints",
        )
        low = ev.metrics_base_port
        check(
            1024 <= low <= 65535 - METRICS_PORT_SPAN
            and (low + METRICS_PORT_SPAN <= cfg.metrics.base_port or low >= cfg.metrics.base_port + METRICS_PORT_SPAN),
            "eval.metrics_base_port",
            f"its block {low}..{low + METRICS_PORT_SPAN - 1} must lie in 1024..65535, apart from metrics.base_port's",
        )
        check(
            ev.server_endpoint not in cfg.endpoints.policy_servers,
            "eval.server_endpoint",
            "is one of endpoints.policy_servers: the periodic evaluation serves its checkpoint on its own",
        )


def run_facts(cfg: PipelineConfig, metrics_port: int = 0, heartbeat_path: str = "") -> RunFacts:
    """The run-wide facts a role is given beside its own sections (common.config.RunFacts); the
    process's own metrics port and heartbeat file where it has them (pipeline/cli.py, role_facts)."""
    sec = cfg.security
    door = DoorLimits(
        vocab_size=0,  # each server adds its model's
        tasks=frozenset([*cfg.replay_buffer.tasks, *cfg.tta.tasks]),
        max_turns=cfg.env.max_turns(),
        max_observation_len=sec.max_observation_len,
        max_action_len=sec.max_action_len,
        max_state_len=sec.max_state_len,
        max_task_description_len=sec.max_task_description_len,
    )
    return RunFacts(
        run_dir=cfg.run_dir,
        seed=cfg.seed,
        startup_timeout_s=cfg.startup_timeout_s,
        model=cfg.model,
        endpoints=cfg.endpoints,
        metrics=cfg.metrics,
        security=cfg.security,
        sync=cfg.pipeline.mode == "sync",
        memory_in_use=cfg.replay_buffer.p_memory > 0,
        max_model_len=cfg.policy_server.max_model_len,
        server_tensor_parallel_size=cfg.policy_server.tensor_parallel_size,
        groups_per_step=cfg.learner.groups_per_step,
        total_steps=cfg.learner.total_steps,
        door=door,
        metrics_port=metrics_port,
        heartbeat_path=heartbeat_path,
    )


def _check_ports(cfg: PipelineConfig) -> None:
    """Every process's metrics port exists (the counts fit their ranges, METRICS_PORTS), lies in
    the valid port range, and no endpoint or NCCL rendezvous port on the metrics host falls into
    the metrics block."""
    m = cfg.metrics
    low, high = m.base_port, m.base_port + METRICS_PORT_SPAN - 1  # in 1024..65535: MetricsConfig.validate
    for key, role, count in (
        ("endpoints.policy_servers", "policy_server", len(cfg.endpoints.policy_servers)),
        ("launch.num_env_actors", "env_actor", cfg.launch.num_env_actors),
        ("env_actor.index", "env_actor", cfg.env_actor.index + 1),
    ):
        if count > METRICS_PORTS[role][1]:
            raise ConfigError(
                key, f"at most {METRICS_PORTS[role][1]} {role} processes have a metrics port, got {count}"
            )
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


def off_loopback(cfg: PipelineConfig) -> set[str]:
    """The hosts other than loopback that the run's servers bind (their endpoints, or endpoints.bind_host):
    the policy servers, the replay buffer, the memory service, the periodic evaluation's server."""
    served = [*cfg.endpoints.policy_servers, cfg.endpoints.replay_buffer, cfg.endpoints.memory_service]
    served += [cfg.eval.server_endpoint] if cfg.eval.every_steps else []
    hosts = {urlparse(cfg.endpoints.bind_address(e)).hostname for e in served if e.startswith("tcp://")}
    return {h for h in hosts if h and not _loopback(h)}


def _loopback(host: str) -> bool:
    """localhost or a loopback address; a DNS name counts as off loopback (where it points is not known here)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
