"""The whole pipeline's configuration: one typed tree; each role reads its own section.

conf/*.yaml is validated against these dataclasses (Hydra structured config), so a typo or a
wrong type fails at start-up with the offending key named. Role sections live in their packages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from actors.config import EnvActorConfig, PolicyServerConfig
from common.model_prep import EMBEDDED_MODEL
from deploy.config import LaunchConfig
from evaluation.config import TestTimeAdaptationConfig
from learner.config import LearnerConfig
from memory_service.config import MemoryServiceConfig
from replay_buffer.config import ReplayBufferConfig


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


@dataclass
class MetricsConfig:
    """Prometheus /metrics: policy server i on base+i, replay buffer base+10, memory service
    base+11, learner base+12, env actor j on base+20+j."""

    host: str = "127.0.0.1"
    base_port: int = 9100

    def port(self, role: str, index: int = 0) -> int:
        offsets = {"policy_server": 0, "replay_buffer": 10, "memory_service": 11, "learner": 12, "env_actor": 20}
        return self.base_port + offsets[role] + index


@dataclass
class PipelineConfig:
    run_dir: str = "runs/default"  # logs, checkpoints, buffer log and memory store of this run (conf: one per run)
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    endpoints: EndpointsConfig = field(default_factory=EndpointsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    policy_server: PolicyServerConfig = field(default_factory=PolicyServerConfig)
    env_actor: EnvActorConfig = field(default_factory=EnvActorConfig)
    replay_buffer: ReplayBufferConfig = field(default_factory=ReplayBufferConfig)
    memory_service: MemoryServiceConfig = field(default_factory=MemoryServiceConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    tta: TestTimeAdaptationConfig = field(default_factory=TestTimeAdaptationConfig)

    def run_path(self, *parts: str) -> Path:
        path = Path(self.run_dir).joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path


CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def load_config(overrides: list[str] | None = None, config_name: str = "pipeline") -> PipelineConfig:
    """Compose conf/<config_name>.yaml with command-line style overrides into a PipelineConfig.

    Every role's main calls this with sys.argv[1:], so `key=value` overrides work the same way
    for every process and for the launcher, which passes its own overrides down to its children.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name="pipeline_schema", node=PipelineConfig)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name=config_name, overrides=list(overrides or []))
    return OmegaConf.to_object(cfg)
