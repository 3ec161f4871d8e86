"""The Kubernetes manifests (deploy/kubernetes.py): every object valid against the Kubernetes schemas
(kubernetes-validate, offline), the pods' commands compose a configuration load_config accepts, each
pod finds its index in its ordinal, the learner token reaches only the buffer and the learner, GPUs
are requested where the config puts a role on CUDA; and what the manifests rely on: a server binding
0.0.0.0 at its endpoint's port (endpoints.bind_host) and one metrics port per kind (metrics.index_ports)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
import zmq

from common.config import EndpointsConfig, MetricsConfig
from deploy.kubernetes import KEYS_DIR, KUBERNETES_VERSION, POD_INDEX, Options, main, manifests, render
from pipeline.config import load_config
from protocol.transport import bind_router

kubernetes_validate = pytest.importorskip("kubernetes_validate")


def _objects(*overrides: str, **options) -> list[dict]:
    return list(
        yaml.safe_load_all(render(manifests(load_config(list(overrides)), list(overrides), Options(**options))))
    )


def _stateful_sets(objects) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}


def _container(stateful_set) -> dict:
    return stateful_set["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize(
    "overrides,options",
    [
        ((), {}),
        (("profile=cpu_learn", "launch.num_env_actors=6"), {"server_count": 3, "storage_class": "nfs"}),
        (("profile=paper", "policy_server.device=cuda", "learner.device=cuda"), {"learner_gpus": 4}),
    ],
)
def test_every_manifest_is_valid_and_every_pod_loads_its_configuration(overrides, options):
    objects = _objects(*overrides, **options)
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    broken = _stateful_sets(objects)["empo2-learner"]
    broken["spec"]["template"]["spec"]["containers"][0]["restartPolicyy"] = "Always"  # the check can fail
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    for name, sts in _stateful_sets(objects).items():
        args = [a.replace(f"$({POD_INDEX})", "0") for a in _container(sts)["args"]]
        overrides_given = args[args.index(name) + 1 :]  # after `-m pipeline <command>`
        cfg = load_config(overrides_given)  # what the pod loads: accepted
        assert cfg.run_dir == "/var/lib/empo2/run" and cfg.endpoints.bind_host == "0.0.0.0"
        assert cfg.endpoints.replay_buffer == "tcp://empo2-replay-buffer-0.empo2-replay-buffer:5560"
        service = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == name)
        assert service["spec"]["clusterIP"] == "None" and sts["spec"]["serviceName"] == name


def test_counts_indices_token_and_metrics_follow_the_configuration():
    sets = _stateful_sets(_objects("launch.num_env_actors=5", server_count=2))
    assert {n: s["spec"]["replicas"] for n, s in sets.items()} == {
        "empo2-policy-server": 2,
        "empo2-memory-service": 1,
        "empo2-replay-buffer": 1,
        "empo2-env-actor": 5,
        "empo2-learner": 1,
    }
    assert f"env_actor.index=$({POD_INDEX})" in _container(sets["empo2-env-actor"])["args"]
    assert f"policy_server.index=$({POD_INDEX})" in _container(sets["empo2-policy-server"])["args"]
    servers = next(a for a in _container(sets["empo2-learner"])["args"] if a.startswith("endpoints.policy_servers="))
    assert servers.count("empo2-policy-server-") == 2
    with_token = {n for n, s in sets.items() if any(e["name"] == "EMPO2_LEARNER_TOKEN" for e in _container(s)["env"])}
    assert with_token == {"empo2-replay-buffer", "empo2-learner"}
    annotations = sets["empo2-env-actor"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9400"  # env actors' first port: every replica's
    assert "resources" not in _container(sets["empo2-learner"])  # CPU: no GPU asked for


def test_gpu_roles_ask_for_their_gpus_and_a_multi_gpu_learner_runs_torchrun():
    overrides = ("policy_server.device=cuda", "policy_server.tensor_parallel_size=2", "learner.device=cuda")
    sets = _stateful_sets(_objects(*overrides, learner_gpus=4))
    assert _container(sets["empo2-policy-server"])["resources"]["limits"] == {"nvidia.com/gpu": 2}
    learner = _container(sets["empo2-learner"])
    assert learner["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert learner["command"][0].endswith("torchrun") and learner["args"][:3] == [
        "--nproc_per_node=4",
        "-m",
        "pipeline",
    ]


def test_empo2_k8s_writes_the_file_and_refuses_keys_the_manifests_set(tmp_path, capsys):
    out = tmp_path / "run.yaml"
    assert main(["--out", str(out), "--namespace", "rl", "learner.total_steps=40"]) == 0
    assert all(o["metadata"]["namespace"] == "rl" for o in yaml.safe_load_all(out.read_text()))
    assert main(["--out", str(out), "endpoints.replay_buffer=tcp://x:1"]) == 2
    assert "set by the manifests" in capsys.readouterr().err
    assert main(["--out", str(out), "learner.gpus=[0]", "learner.device=cuda"]) == 2
    assert "device plugin" in capsys.readouterr().err
    assert main(["--out", str(out), "learner.lrr=1"]) == 2  # a bad key: refused before anything is written


def test_a_server_binds_its_host_at_the_endpoints_port_and_clients_use_the_name():
    endpoints = EndpointsConfig(replay_buffer="tcp://localhost:47361", bind_host="0.0.0.0")
    assert endpoints.bind_address(endpoints.replay_buffer) == "tcp://0.0.0.0:47361"
    assert EndpointsConfig().bind_address("tcp://127.0.0.1:5560") == "tcp://127.0.0.1:5560"  # default: as written
    ctx = zmq.Context()
    server = bind_router(ctx, endpoints.bind_address(endpoints.replay_buffer))
    client = ctx.socket(zmq.DEALER)
    client.connect(endpoints.replay_buffer)
    client.send(b"hello")
    assert server.poll(5000) and server.recv_multipart()[1] == b"hello"
    client.close(0)
    server.close(0)
    ctx.term()


def test_metrics_ports_per_index_or_one_per_kind():
    assert MetricsConfig().port("env_actor", 3) == 9403
    assert MetricsConfig(index_ports=False).port("env_actor", 3) == 9400


def _mounted_keys(objects, tmp_path, name) -> Path:
    """The key files a pod of StatefulSet `name` sees at its keys mount, written out as the kubelet would."""
    secret = next(o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "empo2-curve")
    volume = next(
        v for v in _stateful_sets(objects)[name]["spec"]["template"]["spec"]["volumes"] if v["name"] == "keys"
    )
    root = tmp_path / name
    for item in volume["secret"]["items"]:
        (root / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (root / item["path"]).write_text(secret["stringData"][item["key"]])
    return root


def test_every_pod_uses_curve_with_its_own_keys_only(tmp_path):
    from protocol.security import CLIENT_NAMES, Curve

    objects = _objects()
    for name, stateful_set in _stateful_sets(objects).items():
        args = _container(stateful_set)["args"]
        assert "security.curve=true" in args and f"security.keys_dir={KEYS_DIR}" in args, name
    buffer = _mounted_keys(objects, tmp_path, "empo2-replay-buffer")
    Curve(buffer, None).server_keys()  # a server's pair, loadable
    assert sorted(p.name for p in (buffer / "authorized").iterdir()) == sorted(f"{c}.key" for c in CLIENT_NAMES)
    learner = _mounted_keys(objects, tmp_path, "empo2-learner")
    Curve(learner, "learner").client_keys()
    Curve(learner, "learner").server_public_key()
    actor = _mounted_keys(objects, tmp_path, "empo2-env-actor")
    Curve(actor, "env_actor").client_keys()
    assert {str(p.relative_to(actor)) for p in actor.rglob("*") if p.is_file()} == {
        "server.key",
        "clients/env_actor.key_secret",
    }  # no server secret, no other role's key: a stolen actor pod cannot push weights
    memory = _mounted_keys(objects, tmp_path, "empo2-memory-service")  # a server and a client of the servers
    Curve(memory, "memory_service").client_keys()
    Curve(memory, None).server_keys()
    assert _objects()[0]["stringData"] != objects[0]["stringData"]  # fresh keys per generated file


def test_insecure_manifests_carry_no_keys_and_say_so():
    objects = _objects(secure=False)
    assert not [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "empo2-curve"]
    for stateful_set in _stateful_sets(objects).values():
        assert "security.insecure=true" in _container(stateful_set)["args"]
        assert [v["name"] for v in stateful_set["spec"]["template"]["spec"]["volumes"]] == ["run"]
