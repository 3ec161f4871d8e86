"""Experiment tracking: a run's records sent to TensorBoard, MLflow and/or Weights & Biases (tracking.backends).

What is sent is what the run already writes, so a tracker never shows a number the run's own files
do not: the metrics log <run_dir>/metrics.jsonl (the learner's "step" records as train/<key>, the
evaluations' "eval" records as eval/<key>, at their learner step) and the launcher's rollout counts
from the roles' Prometheus endpoints (rollout/<key>: episodes, env steps, tokens, tips shown, at the
learner step they were read at). Each backend is given the run's composed configuration and git
commit (<run_dir>/launch/config.json, written by empo2-run) once, when it is opened.

Live, empo2-run follows the log at every progress line (launch.progress_every_s). After the fact, or
for a run started by systemd or another launcher, `empo2-track RUN_DIR --backends tensorboard mlflow wandb`
sends what the log holds. Either way a byte offset in <tracking dir>/metrics.offset keeps a record from
being sent twice (a resumed run, a second empo2-track), and an MLflow or W&B run's id in <tracking dir>/
mlflow_run_id or wandb_run_id makes a resumed run one run of its tracker, not two.

Offline by default: TensorBoard event files in <run_dir>/tracking/tensorboard (`tensorboard --logdir`),
an MLflow SQLite store in <run_dir>/tracking/mlflow.db (`mlflow ui --backend-store-uri
sqlite:///...`), or tracking.mlflow_uri for a server; a W&B offline run in <run_dir>/tracking/wandb
(`wandb sync`), or tracking.wandb_mode=online. The libraries are the optional extra `tracking`
(`pip install -e '.[tracking]'`); a backend asked for without its library is refused at start.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

from common.config import ConfigError, TrackingConfig
from common.metrics import METRICS_LOG

CONFIG_FILE = Path("launch") / "config.json"  # the composed configuration, its overrides and git commit
OFFSET_FILE = "metrics.offset"
MLFLOW_RUN_FILE = "mlflow_run_id"
WANDB_RUN_FILE = "wandb_run_id"
PREFIX = {"step": "train", "eval": "eval"}  # a metrics-log record's kind -> its scalars' prefix
REPO = Path(__file__).resolve().parent.parent


def git_commit(repo: Path = REPO) -> str:
    """HEAD of the checkout the run's code came from, with "-dirty" when it has uncommitted changes;
    "unknown" outside a git checkout (an installed package)."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "-uno"], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_config_record(config: dict, overrides: list[str]) -> dict:
    """What <run_dir>/launch/config.json holds: the composed configuration as plain containers
    (pipeline.config.to_dict), the command line's overrides and the git commit."""
    return {"config": config, "overrides": list(overrides), "git_commit": git_commit()}


def flat(tree: dict, prefix: str = "", sep: str = ".") -> dict:
    """{"learner": {"lr": 1e-5}} -> {"learner.lr": 1e-5}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}{sep}", sep))
        else:
            out[f"{prefix}{key}"] = value
    return out


def scalars(record: dict) -> tuple[int, dict[str, float]] | None:
    """A metrics-log record as (learner step, {"train/<key>": value}) of its numbers (nested dicts,
    such as episodes_by_mode, flattened with "/"); None for a record of another kind."""
    prefix = PREFIX.get(record.get("record"))
    if prefix is None:
        return None
    values = flat({k: v for k, v in record.items() if k not in ("record", "step")}, f"{prefix}/", "/")
    numbers = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return int(record["step"]), numbers


class TensorBoardSink:
    def __init__(self, out: Path, record: dict):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch's writer needs the tensorboard package
            raise ConfigError("tracking", f"backend tensorboard: {e}; pip install -e '.[tracking]'") from e
        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))
        config = json.dumps(record.get("config", {}), indent=1)
        self.writer.add_text("run/config", f"```\n{config}\n```")
        self.writer.add_text("run/git_commit", record.get("git_commit", "unknown"))
        self.writer.add_text("run/overrides", " ".join(record.get("overrides", [])) or "(none)")

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MlflowSink:
    PARAMS_PER_CALL = 100  # MLflow's limit on the params of one log_batch

    def __init__(self, out: Path, record: dict, cfg: TrackingConfig, run_name: str):
        try:
            from mlflow.entities import Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise ConfigError("tracking", f"backend mlflow: {e}; pip install -e '.[tracking]'") from e
        self.client = MlflowClient(cfg.mlflow_uri or f"sqlite:///{(out / 'mlflow.db').resolve()}")
        run_file = out / MLFLOW_RUN_FILE
        if run_file.exists():  # a resumed run: the same MLflow run
            self.run_id = run_file.read_text().strip()
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name(cfg.experiment)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(cfg.experiment)
        tags = {"git_commit": record.get("git_commit", "unknown"), "overrides": " ".join(record.get("overrides", []))}
        self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
        params = [Param(k, str(v)) for k, v in flat(record.get("config", {})).items()]
        for i in range(0, len(params), self.PARAMS_PER_CALL):
            self.client.log_batch(self.run_id, params=params[i : i + self.PARAMS_PER_CALL])
        self.client.log_batch(self.run_id, tags=[RunTag("tracked_by", "empo2")])
        run_file.write_text(self.run_id)

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k.replace("/", "."), v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's limit on the metrics of one log_batch
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbSink:
    # W&B drops a row logged at a step below its last one, and a periodic evaluation of step 20 can be
    # written after step 22's record: so the learner step is a logged value, every chart's x-axis,
    # and W&B's own step just counts rows
    STEP_KEY = "learner_step"

    def __init__(self, out: Path, record: dict, cfg: TrackingConfig, run_name: str):
        try:
            import wandb
        except ImportError as e:
            raise ConfigError("tracking", f"backend wandb: {e}; pip install -e '.[tracking]'") from e
        run_file = out / WANDB_RUN_FILE
        run_id = run_file.read_text().strip() if run_file.exists() else secrets.token_hex(4)  # a resumed run: the same
        config = {
            **record.get("config", {}),
            "git_commit": record.get("git_commit", "unknown"),
            "overrides": " ".join(record.get("overrides", [])),
        }
        try:
            self.run = wandb.init(
                mode=cfg.wandb_mode,
                dir=str(out),
                project=cfg.experiment,
                name=run_name,
                id=run_id,
                resume="allow",
                config=config,
                settings=wandb.Settings(silent=True, console="off"),  # the roles' own logs stay the console
            )
        except Exception as e:  # online without credentials, an unreachable server: refused at start
            raise ConfigError("tracking", f"backend wandb ({cfg.wandb_mode}): {type(e).__name__}: {e}") from e
        run_file.write_text(run_id)
        self.run.define_metric(self.STEP_KEY)
        self.run.define_metric("*", step_metric=self.STEP_KEY)

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log({self.STEP_KEY: step, **values})

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # stops W&B's service process, which would otherwise outlive the run's last use


class Tracker:
    """The backends of tracking.backends, fed from a run directory's metrics log and rollout counts."""

    def __init__(self, cfg: TrackingConfig, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.out = Path(cfg.dir) if cfg.dir else self.run_dir / "tracking"
        self.out.mkdir(parents=True, exist_ok=True)
        config_path = self.run_dir / CONFIG_FILE
        record = json.loads(config_path.read_text()) if config_path.exists() else {}
        opened = {
            "tensorboard": lambda: TensorBoardSink(self.out, record),
            "mlflow": lambda: MlflowSink(self.out, record, cfg, self.run_dir.resolve().name),
            "wandb": lambda: WandbSink(self.out, record, cfg, self.run_dir.resolve().name),
        }
        self.sinks = [opened[name]() for name in cfg.backends]
        self.offset_path = self.out / OFFSET_FILE

    def send(self, step: int, values: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, values)

    def follow(self) -> int:
        """Send the metrics log's records written since the last call (whole lines only: a line being
        appended waits for the next call); how many were sent."""
        log = self.run_dir / METRICS_LOG
        offset = int(self.offset_path.read_text()) if self.offset_path.exists() else 0
        if not log.exists() or log.stat().st_size <= offset:
            return 0
        with open(log, "rb") as f:
            f.seek(offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        sent = 0
        for line in complete.splitlines():
            try:
                found = scalars(json.loads(line))
            except (json.JSONDecodeError, TypeError, AttributeError):  # a cut or foreign line, as read_log skips it
                continue
            if found:
                self.send(*found)
                sent += 1
        self.offset_path.write_text(str(offset + len(complete)))
        return sent

    def rollout(self, step: int, counts: dict) -> None:
        """The launcher's rollout counts (deploy/launch.py Launcher.progress) at learner step `step`."""
        numbers = {f"rollout/{k}": float(v) for k, v in counts.items() if isinstance(v, (int, float))}
        self.send(step, numbers)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="empo2-track",
        description="Send a run's metrics log (learner steps, evaluations) to TensorBoard, MLflow and/or W&B, "
        "after the fact or for a run empo2-run did not launch; records sent before are not sent again.",
    )
    parser.add_argument("run_dir", type=Path, help="a run directory holding metrics.jsonl")
    parser.add_argument("--backends", nargs="+", choices=TrackingConfig.BACKENDS, required=True)
    parser.add_argument("--dir", default="", help="where the backends write (default <run_dir>/tracking)")
    parser.add_argument("--mlflow-uri", default="", help="an MLflow server or store (default: <dir>/mlflow.db)")
    parser.add_argument("--experiment", default=TrackingConfig.experiment, help="MLflow experiment, W&B project")
    parser.add_argument("--wandb-mode", choices=TrackingConfig.WANDB_MODES, default=TrackingConfig.wandb_mode)
    args = parser.parse_args(argv)
    if not (args.run_dir / METRICS_LOG).exists():
        print(f"empo2-track: {args.run_dir} has no {METRICS_LOG}: not a run directory", file=sys.stderr)
        return 2
    cfg = TrackingConfig(
        backends=args.backends,
        dir=args.dir,
        mlflow_uri=args.mlflow_uri,
        experiment=args.experiment,
        wandb_mode=args.wandb_mode,
    )
    try:
        cfg.validate()
        tracker = Tracker(cfg, args.run_dir)
    except ConfigError as e:
        print(f"empo2-track: {e}", file=sys.stderr)
        return 2
    sent = tracker.follow()
    tracker.close()
    print(
        f"empo2-track: {sent} records of {args.run_dir / METRICS_LOG} sent to {', '.join(args.backends)} in {tracker.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
