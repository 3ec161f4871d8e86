"""Kubernetes manifests for a run, composed from the same configuration as empo2-run:
`empo2-k8s [--out FILE] [--image IMAGE] [--namespace NS] ... [key=value ...]` writes one YAML file:

    Secret                 the run's learner token (the buffer serves batches only to its learner)
    Secret                 the run's CURVE keys (unless --insecure): each pod mounts only its own, at KEYS_DIR
    PersistentVolumeClaim  the run directory, shared by every pod (ReadWriteMany): logs, the buffer
                           log, the memory store, checkpoints, metrics.jsonl
    per role: a headless Service and a StatefulSet
        empo2-policy-server  one replica per endpoints.policy_servers entry (or --policy-servers), nvidia.com/gpu x
                             policy_server.tensor_parallel_size each when policy_server.device=cuda
        empo2-memory-service, empo2-replay-buffer   one replica each
        empo2-env-actor      launch.num_env_actors replicas: `kubectl scale statefulset empo2-env-actor`
        empo2-learner        one pod; --learner-gpus N > 1 runs torchrun with N ranks (learner.device=cuda)

A StatefulSet gives each pod a stable DNS name (empo2-policy-server-0.empo2-policy-server), so the
endpoints every process is given are those names (ZeroMQ over TCP), servers bind 0.0.0.0 at their
port (endpoints.bind_host), every process of a kind serves its metrics on its kind's port
(metrics.index_ports=false; one address per pod) on 0.0.0.0, announced to Prometheus with the
prometheus.io/* annotations; a pod's ordinal (the apps.kubernetes.io/pod-index label) is its
policy_server.index or env_actor.index. Kubernetes restarts a pod that exits, as empo2-run restarts
a role; the learner's pod ends the run (it exits 0 after learner.total_steps: delete the workload).

The pod network is off loopback, so every socket uses CURVE (security.curve): the keys are made once
per generated file (protocol/security.py) and kept only in the empo2-curve Secret; a server's pod
mounts the servers' key pair and the authorized client keys, a client's pod its role's key pair and the
servers' public key, so a stolen env-actor pod cannot push weights (SENDERS). --insecure: no keys, and
security.insecure=true says that any client reaching the pods is served.

Every generated manifest is validated offline against the Kubernetes schemas in the suite
(tests/unit/deploy/test_kubernetes.py, kubernetes-validate); none has run on a cluster here.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.config import ConfigError
from common.process import ROLE_ENV, ROLE_ENV_DEFAULTS
from pipeline.config import PipelineConfig, load_config
from pipeline.roles import LEARNER_TOKEN_ENV, ROLES
from protocol.security import CLIENT_NAMES, generate_keys

RUN_DIR = "/var/lib/empo2/run"  # the volume's mount point in every pod
KEYS_DIR = "/var/lib/empo2/keys"  # where a pod finds its CURVE keys (security.keys_dir)
REPO = "/opt/empo2"  # where the image holds this repository, set up (deploy/kubernetes.Dockerfile)
VENV = f"{REPO}/.venv/bin"
KUBERNETES_VERSION = "1.30"  # the schema the manifests are written and validated against (pod-index label: 1.28+)
POD_INDEX = "EMPO2_POD_INDEX"  # the pod's ordinal, from its apps.kubernetes.io/pod-index label
PORTS = {"empo2-policy-server": 5550, "empo2-replay-buffer": 5560, "empo2-memory-service": 5570}


@dataclass(frozen=True)
class Options:
    image: str = "empo2:latest"  # an image with this repository set up at REPO (deploy/kubernetes.Dockerfile)
    namespace: str = "empo2"
    storage_class: str = ""  # "" = the cluster's default; it must offer ReadWriteMany
    storage: str = "50Gi"
    server_count: int = 0  # policy servers; 0 = as many as the configuration's endpoints.policy_servers
    learner_gpus: int = 1  # with learner.device=cuda: the learner pod's GPUs (torchrun ranks when > 1)
    secure: bool = True  # CURVE on every socket, keys in the empo2-curve Secret (security.curve)


def endpoints(count: int) -> list[str]:
    """The overrides that point every process at the StatefulSets' DNS names (`count` policy servers)
    and open the servers and metrics to the pod network."""
    servers = ",".join(
        f"tcp://empo2-policy-server-{i}.empo2-policy-server:{PORTS['empo2-policy-server']}" for i in range(count)
    )
    return [
        f"endpoints.policy_servers=[{servers}]",
        f"endpoints.replay_buffer=tcp://empo2-replay-buffer-0.empo2-replay-buffer:{PORTS['empo2-replay-buffer']}",
        f"endpoints.memory_service=tcp://empo2-memory-service-0.empo2-memory-service:{PORTS['empo2-memory-service']}",
        "endpoints.bind_host=0.0.0.0",
        "metrics.host=0.0.0.0",
        "metrics.index_ports=false",
        f"run_dir={RUN_DIR}",
    ]


def manifests(cfg: PipelineConfig, overrides: list[str], opts: Options) -> list[dict]:
    """Every object of the deployment, in apply order."""
    cluster = [*overrides, *endpoints(opts.server_count or len(cfg.endpoints.policy_servers))]
    keys = curve_keys() if opts.secure else {}
    cluster += ["security.curve=true", f"security.keys_dir={KEYS_DIR}"] if keys else ["security.insecure=true"]
    deployed = load_config(cluster)  # what the pods will load: refused here, not in the cluster
    token = secrets.token_urlsafe(24)  # one per generated file: the Secret is the only copy
    objects: list[dict] = [
        *(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "empo2-curve", "namespace": opts.namespace},
                    "type": "Opaque",
                    "stringData": keys,
                }
            ]
            if keys
            else []
        ),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "empo2-learner-token", "namespace": opts.namespace},
            "type": "Opaque",
            "stringData": {"token": token},
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "empo2-run", "namespace": opts.namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": opts.storage}},
                **({"storageClassName": opts.storage_class} if opts.storage_class else {}),
            },
        },
    ]
    replicas = {
        "empo2-policy-server": len(deployed.endpoints.policy_servers),
        "empo2-memory-service": 1,
        "empo2-replay-buffer": 1,
        "empo2-env-actor": deployed.launch.num_env_actors,
        "empo2-learner": 1,
    }
    for command, count in replicas.items():
        objects += _role(command, count, cluster, deployed, opts)
    return objects


def curve_keys() -> dict[str, str]:
    """A fresh set of the run's CURVE keys (protocol/security.py generate_keys) as the Secret's entries:
    each file's path under the keys directory with "/" as "." (server.key_secret, clients.learner.key_secret,
    authorized.env_actor.key)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        generate_keys(root)
        return {".".join(p.relative_to(root).parts): p.read_text() for p in sorted(root.rglob("*.key*")) if p.is_file()}


def key_items(command: str) -> list[dict]:
    """The Secret's entries a pod of `command` mounts, at their paths under KEYS_DIR: every pod the
    servers' public key; a server's (it binds a port) the servers' pair and the authorized client keys;
    a client's its own role's pair. Nothing of another role's secret."""
    role = ROLES[command]
    wanted = ["server.key"]
    if command in PORTS:
        wanted += ["server.key_secret", *(f"authorized.{c}.key" for c in CLIENT_NAMES)]
    if role.curve_client:
        wanted += [f"clients.{role.curve_client}.key_secret"]
    return [
        {"key": k, "path": k.replace(".", "/", 1) if k.startswith(("clients.", "authorized.")) else k} for k in wanted
    ]


def _role(command: str, replicas: int, overrides: list[str], cfg: PipelineConfig, opts: Options) -> list[dict]:
    role = ROLES[command]
    name = command  # the console scripts' names are DNS-safe: empo2-policy-server
    labels = {"app.kubernetes.io/name": "empo2", "app.kubernetes.io/component": name}
    metrics_port = cfg.metrics.port(role.metrics) if role.metrics else None
    args = [*overrides]
    if role.index_key and role.index_key != "RANK":
        args.append(f"{role.index_key}=$({POD_INDEX})")  # Kubernetes expands $(VAR) from the container's env
    gpus = _gpus(command, cfg, opts)
    if command == "empo2-learner" and gpus > 1:
        argv = [f"{VENV}/torchrun", f"--nproc_per_node={gpus}", "-m", "pipeline", command, *args]
    else:
        argv = [f"{VENV}/python", "-m", "pipeline", command, *args]
    env = [{"name": k, "value": v} for k, v in {**ROLE_ENV_DEFAULTS, **ROLE_ENV}.items()]
    env.append(
        {"name": POD_INDEX, "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}}
    )
    if role.learner_token:
        env.append(
            {"name": LEARNER_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": "empo2-learner-token", "key": "token"}}}
        )
    ports = [{"name": "metrics", "containerPort": metrics_port}] if metrics_port else []
    if name in PORTS:
        ports.insert(0, {"name": "zmq", "containerPort": PORTS[name]})
    container = {
        "name": name,
        "image": opts.image,
        "workingDir": REPO,
        "command": argv[:1],
        "args": argv[1:],
        "env": env,
        "ports": ports,
        "volumeMounts": [{"name": "run", "mountPath": RUN_DIR}],
    }
    volumes = [{"name": "run", "persistentVolumeClaim": {"claimName": "empo2-run"}}]
    if cfg.security.curve:  # the pod's own keys, read-only, readable by its user alone
        container["volumeMounts"].append({"name": "keys", "mountPath": KEYS_DIR, "readOnly": True})
        items = key_items(command)
        volumes.append({"name": "keys", "secret": {"secretName": "empo2-curve", "items": items, "defaultMode": 0o400}})
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    annotations = (
        {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics_port), "prometheus.io/path": "/metrics"}
        if metrics_port
        else {}
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": opts.namespace, "labels": labels},
        "spec": {
            "clusterIP": "None",  # headless: one DNS name per pod
            "publishNotReadyAddresses": True,  # clients wait for their servers themselves (startup_timeout_s)
            "selector": labels,
            "ports": [{"name": p["name"], "port": p["containerPort"]} for p in ports],
        },
    }
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": opts.namespace, "labels": labels},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",  # every pod at once, as empo2-run starts its roles
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "containers": [container],
                    "volumes": volumes,
                    "terminationGracePeriodSeconds": int(cfg.launch.stop_grace_s),
                },
            },
        },
    }
    return [service, stateful_set]


def _gpus(command: str, cfg: PipelineConfig, opts: Options) -> int:
    if command == "empo2-policy-server" and str(cfg.policy_server.device) == "cuda":
        return cfg.policy_server.tensor_parallel_size
    if command == "empo2-learner" and str(cfg.learner.device) == "cuda":
        return opts.learner_gpus
    return 0


class _PlainDumper(yaml.SafeDumper):
    def ignore_aliases(self, data) -> bool:  # the labels written out at each use, not as YAML anchors
        return True


def render(objects: list[dict]) -> str:
    return yaml.dump_all(objects, Dumper=_PlainDumper, sort_keys=False)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="empo2-k8s",
        description="Write Kubernetes manifests (StatefulSets, headless Services, a volume, a Secret) for the "
        "run the key=value overrides compose; `kubectl apply -f FILE` deploys it.",
    )
    defaults = Options()
    p.add_argument("--out", type=Path, default=Path("empo2-k8s.yaml"))
    p.add_argument("--image", default=defaults.image, help="an image with this repository set up at /opt/empo2")
    p.add_argument("--namespace", default=defaults.namespace)
    p.add_argument("--storage-class", default=defaults.storage_class, help="one that offers ReadWriteMany")
    p.add_argument("--storage", default=defaults.storage, help="the run volume's size")
    p.add_argument("--policy-servers", type=int, default=defaults.server_count, help="0: the config's count")
    p.add_argument("--learner-gpus", type=int, default=defaults.learner_gpus, help="with learner.device=cuda")
    p.add_argument("--insecure", action="store_true", help="no CURVE (the pod network is trusted)")
    p.add_argument("overrides", nargs="*", help="key=value, as for empo2-run")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for key in (
        "endpoints.",
        "run_dir=",
        "metrics.host=",
        "metrics.index_ports=",
        "policy_server.gpus=",
        "learner.gpus=",
        "security.curve=",
        "security.keys_dir=",
    ):
        if any(o.startswith(key) for o in args.overrides):
            print(
                f"empo2-k8s: {key.rstrip('.=')} is set by the manifests (the pods' DNS names, volume and keys; "
                "each pod's GPUs are the ones the device plugin gives it; --insecure: no CURVE)",
                file=sys.stderr,
            )
            return 2
    try:
        cfg = load_config(args.overrides)
        opts = Options(
            args.image,
            args.namespace,
            args.storage_class,
            args.storage,
            args.policy_servers,
            args.learner_gpus,
            not args.insecure,
        )
        objects = manifests(cfg, args.overrides, opts)
    except ConfigError as e:
        print(f"empo2-k8s: {e}", file=sys.stderr)
        return 2
    args.out.write_text(render(objects))
    counts = {o["metadata"]["name"]: o["spec"]["replicas"] for o in objects if o["kind"] == "StatefulSet"}
    print(f"empo2-k8s: wrote {args.out} ({len(objects)} objects; pods: {counts}); kubectl apply -f {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
