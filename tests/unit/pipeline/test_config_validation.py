"""load_config refuses a bad configuration with one ConfigError naming the key: every choice
field (an Enum OmegaConf checks) and every range and cross-section rule of pipeline.config.validate."""

from __future__ import annotations

import dataclasses
import json
import typing
from enum import Enum

import msgpack
import pytest

from common.config import ConfigError
from pipeline.config import PipelineConfig, load_config


def _choice_fields(cls=PipelineConfig, prefix: str = "") -> list[tuple[str, type[Enum]]]:
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out += _choice_fields(t, f"{prefix}{f.name}.")
        elif isinstance(t, type) and issubclass(t, Enum):
            out.append((prefix + f.name, t))
    return out


CHOICES = _choice_fields()


def test_the_choice_fields_are_enums():
    keys = {key for key, _ in CHOICES}
    assert {
        "weight_sync.method",
        "learner.ratio",
        "learner.lr_schedule",
        "learner.intrinsic_kind",
        "learner.advantage",
        "learner.gigpo_step_norm",
        "learner.low_prob_mask",
        "learner.device",
        "policy_server.device",
        "policy_server.dtype",
        "policy_server.on_update",
        "env_actor.server_selection",
        "memory_service.key",
    } <= keys


@pytest.mark.parametrize("key, enum", CHOICES, ids=[key for key, _ in CHOICES])
def test_a_bad_choice_is_refused_with_the_key_and_the_choices(key, enum):
    with pytest.raises(ConfigError) as err:
        load_config([f"{key}=nonsense"])
    assert err.value.key == key
    assert f"[{', '.join(m.value for m in enum)}]" in str(err.value)


def test_choices_load_by_their_values_and_read_as_plain_strings():
    cfg = load_config([f"{key}={list(enum)[-1].value}" for key, enum in CHOICES if key != "weight_sync.method"])
    for key, enum in CHOICES:
        section, name = key.rsplit(".", 1)
        value = getattr(getattr(cfg, section), name)
        expected = enum(value).value
        assert value == expected and str(value) == expected and f"{value}" == expected
    assert cfg.memory_service.key == "global"  # a Python keyword as a member name (functional Enum)
    # what goes into messages and JSON reports is the plain value
    packed = msgpack.unpackb(msgpack.packb([cfg.learner.ratio, cfg.memory_service.key]))
    assert packed == ["decoupled", "global"] and all(type(v) is str for v in packed)
    assert json.dumps({"key": cfg.memory_service.key}) == '{"key": "global"}'


# (overrides, the key the error names)
RULES = [
    # cross-section
    (["memory_service.reflection_prompt_tokens=2000"], "memory_service.reflection_prompt_tokens"),  # 2048 context
    (["memory_service.reflection_max_tokens=2048"], "memory_service.reflection_prompt_tokens"),
    (["env_actor.prompt_token_budget=2020"], "env_actor.prompt_token_budget"),  # + 32 action tokens > 2048
    (["env_actor.demo_max_steps=-1"], "env_actor.demo_max_steps"),
    (["learner.lora_rank=8", "weight_sync.method=nccl"], "weight_sync.method"),
    (["weight_sync.method=nccl", "policy_server.device=cpu"], "weight_sync.method"),
    (["weight_sync.method=nccl", "learner.device=cpu"], "weight_sync.method"),
    (["replay_buffer.max_ready_groups=1", "learner.groups_per_step=2"], "replay_buffer.max_ready_groups"),
    (["weight_sync.zmq_chunk_bytes=2000000000"], "weight_sync.zmq_chunk_bytes"),  # over the servers' message limit
    (["weight_sync.method=shm", "weight_sync.shm_dir=/tmp"], "weight_sync.shm_dir"),  # not an allowed weight dir
    (["policy_server.index=1"], "policy_server.index"),  # one endpoint
    (["policy_server.tensor_parallel_size=2", "policy_server.device=cpu"], "policy_server.tensor_parallel_size"),
    (["endpoints.memory_service=tcp://127.0.0.1:5560"], "endpoints.memory_service"),  # the buffer's port
    # staleness and batches
    (["learner.max_staleness=-1"], "learner.max_staleness"),
    (["learner.groups_per_step=0", "replay_buffer.max_ready_groups=1"], "learner.groups_per_step"),
    (["replay_buffer.group_size=1"], "replay_buffer.group_size"),
    (["replay_buffer.max_open_groups=0"], "replay_buffer.max_open_groups"),
    (["replay_buffer.variations_per_task=0"], "replay_buffer.variations_per_task"),
    (["replay_buffer.tasks=[]"], "replay_buffer.tasks"),
    (["replay_buffer.tasks=[find-living-thing,find-livng-thing]"], "replay_buffer.tasks"),  # not a task
    (["tta.tasks=[bake]"], "tta.tasks"),
    (["+env.max_steps_per_task.boill=100"], "env.max_steps_per_task"),
    # probabilities and the objective
    (["replay_buffer.p_memory=1.5"], "replay_buffer.p_memory"),
    (["replay_buffer.q_off_policy=-0.1"], "replay_buffer.q_off_policy"),
    (["learner.lr=0"], "learner.lr"),
    (["learner.clip_low=1.0"], "learner.clip_low"),
    (["learner.clip_high=-0.1"], "learner.clip_high"),
    (["learner.dual_clip=1.0"], "learner.dual_clip"),
    (["learner.behaviour_weight_cap=0"], "learner.behaviour_weight_cap"),
    (["learner.gigpo_gamma=1.5"], "learner.gigpo_gamma"),
    (["learner.micro_batch_tokens=0"], "learner.micro_batch_tokens"),
    (["learner.mini_batch_samples=-1"], "learner.mini_batch_samples"),
    (["learner.update_epochs=0"], "learner.update_epochs"),
    (["learner.score_scale=0"], "learner.score_scale"),
    (["learner.keep_checkpoints=0"], "learner.keep_checkpoints"),
    # sizes, episodes, timeouts
    (["endpoints.policy_servers=[]"], "endpoints.policy_servers"),
    (["env.max_steps=0"], "env.max_steps"),
    (["env.max_steps_per_task.boil=0"], "env.max_steps_per_task.boil"),
    (["+env.max_steps_per_task.find-plant=0"], "env.max_steps_per_task.find-plant"),
    (["env.env_step_limit=0"], "env.env_step_limit"),
    (["env_actor.envs_per_actor=0"], "env_actor.envs_per_actor"),
    (["env_actor.max_action_tokens=0"], "env_actor.max_action_tokens"),
    (["env_actor.generate_timeout_s=0"], "env_actor.generate_timeout_s"),
    (["startup_timeout_s=-1"], "startup_timeout_s"),
    (["memory_service.top_k=0"], "memory_service.top_k"),
    (["memory_service.capacity=0"], "memory_service.capacity"),
    (["memory_service.similarity_threshold=2"], "memory_service.similarity_threshold"),
    (["policy_server.gpu_memory_utilization=0"], "policy_server.gpu_memory_utilization"),
    (["launch.num_env_actors=0"], "launch.num_env_actors"),
    (["env_actor.lease_renew_s=41"], "env_actor.lease_renew_s"),  # over a third of replay_buffer.lease_ttl_s (120)
    (["replay_buffer.lease_ttl_s=0"], "replay_buffer.lease_ttl_s"),
    (["env_actor.lease_renew_s=0"], "env_actor.lease_renew_s"),
    (["launch.hang_timeout_s=-1"], "launch.hang_timeout_s"),
    (["launch.hang_timeout_s=100"], "launch.hang_timeout_s"),  # under env_actor.generate_timeout_s (300)
    (["launch.hang_timeout_s=60", "env_actor.generate_timeout_s=45"], "launch.hang_timeout_s"),  # push 300
    (["pipeline.rollout_nice=20"], "pipeline.rollout_nice"),
    (["pipeline.rollout_nice=-1"], "pipeline.rollout_nice"),
    (["tta.trials=0"], "tta.trials"),
    (["tta.tasks=[]"], "tta.tasks"),
    # metrics ports (tests/unit/pipeline/test_metrics_ports.py has the layout)
    (["metrics.base_port=65000"], "metrics.base_port"),
    (["launch.num_env_actors=701"], "launch.num_env_actors"),
    (["env_actor.index=700"], "env_actor.index"),
    (["endpoints.replay_buffer=tcp://127.0.0.1:9200"], "endpoints.replay_buffer"),  # a metrics port
    (["weight_sync.method=nccl", "weight_sync.nccl_port=9150"], "weight_sync.nccl_port (+0)"),
    (["endpoints.replay_buffer=tcp://127.0.0.1"], "endpoints.replay_buffer"),  # no port
    # types and names (OmegaConf, Hydra)
    (["learner.total_steps=abc"], "learner.total_steps"),
    (["learner.foo=1"], "learner.foo"),
    (["+learner.lrr=5"], "learner.lrr"),  # added keys the schema lacks: refused, not dropped (issue 42)
    (["learner.gpus=[0,-1]"], "learner.gpus"),
    (["learner.gpus=[1,1]", "learner.device=cuda"], "learner.gpus"),
    (["learner.gpus=[0]", "learner.device=cpu"], "learner.gpus"),
    (["learner.gpus=[0,1]", "learner.device=cuda", "launch.learner_ranks=4"], "learner.gpus"),
    (["launch.learner_ranks=0"], "launch.learner_ranks"),
    (["policy_server.gpus=[[0]]", "policy_server.device=cpu"], "policy_server.gpus[0]"),
    (["policy_server.gpus=[[0]]", "policy_server.tensor_parallel_size=2"], "policy_server.gpus[0]"),
    (["policy_server.gpus=[[0],[1]]"], "policy_server.gpus"),  # two entries, one server
    (["endpoints.bind_host=0.0.0.0"], "security.curve"),  # servers open to every host, without CURVE
    (["endpoints.replay_buffer=tcp://10.0.0.1:5560"], "security.curve"),
    (["endpoints.memory_service=tcp://memory.example:5570"], "security.curve"),  # a name is not loopback
    (["++learner.lrr=5"], "learner.lrr"),
    (["+lrr=5"], "lrr"),
    (["++nosuch.x=1"], "nosuch"),
    (["profile=nope"], "profile"),
    (["preset=nope"], "preset"),
]


@pytest.mark.parametrize("overrides, key", RULES, ids=[" ".join(o) for o, _ in RULES])
def test_a_broken_rule_is_refused_naming_its_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    assert err.value.key == key, str(err.value)
    assert str(err.value).startswith(f"{key}: ") and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "override, key, near",
    [
        ("learner.lrr=5", "learner.lrr", "learner.lr"),
        ("+learner.lrr=5", "learner.lrr", "learner.lr"),
        ("++learner.lrr=5", "learner.lrr", "learner.lr"),
        ("+learner.clip_hgh=0.2", "learner.clip_hgh", "learner.clip_high or learner.clip_low"),
        ("+memory_service.topk=3", "memory_service.topk", "memory_service.top_k"),
        ("learner.top_k=3", "learner.top_k", "memory_service.top_k"),  # the name, in another section
        ("lerner.lr=5", "lerner", "learner"),
    ],
)
def test_an_unknown_key_names_the_nearest_valid_ones(override, key, near):
    with pytest.raises(ConfigError) as err:
        load_config([override])
    assert err.value.key == key and str(err.value).endswith(f"; did you mean {near}?"), str(err.value)
    assert "\n" not in str(err.value)


def test_an_added_key_a_map_field_takes_is_still_accepted():
    """`+` adds to a map (env.max_steps_per_task) as before; only a section's unknown keys are refused."""
    cfg = load_config(["~profile", "+env.max_steps_per_task.find-plant=7", "++env.max_steps_per_task.boil=50"])
    assert (cfg.env.step_limit("find-plant"), cfg.env.step_limit("boil")) == (7, 50)


@pytest.mark.parametrize(
    "overrides",
    [
        ["weight_sync.method=shm"],  # /dev/shm is an allowed weight dir
        ["weight_sync.method=nccl"],  # devices auto: a GPU may be there; the roles check at start-up
        ["weight_sync.method=nccl", "policy_server.device=cuda", "learner.device=cuda"],
        ["learner.lora_rank=8", "weight_sync.method=checkpoint"],
        ["replay_buffer.max_ready_groups=2", "learner.groups_per_step=2"],
        ["endpoints.policy_servers=[tcp://127.0.0.1:5550,tcp://127.0.0.1:5551]", "policy_server.index=1"],
        ["endpoints.policy_servers=[tcp://10.0.0.2:5550,tcp://10.0.0.3:5550]", "security.curve=true"],  # other hosts
        ["endpoints.bind_host=0.0.0.0", "security.insecure=true"],  # off loopback without CURVE, accepted
        ["endpoints.replay_buffer=tcp://localhost:5560", "endpoints.memory_service=tcp://127.0.0.2:5570"],
        ["endpoints.memory_service=ipc:///tmp/empo2-memory"],
        ["launch.num_env_actors=700", "env_actor.index=699"],
        ["launch.hang_timeout_s=0", "learner.push_timeout_s=900"],  # hang detection off
        ["replay_buffer.lease_ttl_s=30", "env_actor.lease_renew_s=10"],  # a short lease, renewed thrice in it
        ["launch.hang_timeout_s=60", "env_actor.generate_timeout_s=45", "learner.push_timeout_s=45"],
        [  # two servers of 2 GPUs each beside a learner on the other 4 of an 8-GPU host
            "endpoints.policy_servers=[tcp://127.0.0.1:5550,tcp://127.0.0.1:5551]",
            "policy_server.tensor_parallel_size=2",
            "policy_server.gpus=[[0,1],[2,3]]",
            "learner.gpus=[4,5,6,7]",
        ],
        ["profile=paper"],
        ["profile=e2e"],
        ["~profile"],
        *[[f"preset={p}"] for p in ("empo2", "grpo", "gigpo", "rnd")],
    ],
)
def test_valid_combinations_load(overrides):
    load_config(overrides)


def test_the_reference_step_limits_are_the_defaults_and_the_cpu_profile_keeps_4_steps():
    from common.config import REFERENCE_TASK_STEP_LIMITS

    paper = load_config(["profile=paper"]).env
    assert paper.max_steps_per_task == REFERENCE_TASK_STEP_LIMITS
    assert (paper.step_limit("boil"), paper.step_limit("measure-melting-point-known-substance")) == (100, 120)
    assert paper.step_limit("find-living-thing") == 30 and paper.env_step_limit == 100
    assert paper.simplification == "easy"
    cpu = load_config([]).env  # the map merged from the defaults is there, but not in force
    assert cpu.step_limit("find-living-thing") == 4 and cpu.step_limit("boil") == 4 and cpu.task_limits() == {}
    changed = load_config(["~profile", "env.max_steps_per_task.boil=50", "+env.max_steps_per_task.find-plant=7"]).env
    assert (changed.step_limit("boil"), changed.step_limit("find-plant"), changed.step_limit("melt")) == (50, 7, 80)


def test_the_paper_profile_has_the_reference_sampling_and_response_cap():
    cfg = load_config(["profile=paper"])
    assert cfg.model.name == "Qwen/Qwen2.5-7B-Instruct"
    assert (cfg.env_actor.temperature, cfg.tta.temperature, cfg.env_actor.max_action_tokens) == (1.0, 0.4, 32)
    assert cfg.memory_service.reflection_temperature == cfg.env_actor.temperature  # reflections at the rollout's
