"""Experiment tracking (common/tracking.py): what a run's metrics log holds reaches TensorBoard, MLflow and
W&B, read back with each library's own reader (W&B's offline run file with the reader below, since wandb
no longer ships one); nothing twice; a resumed run is the same MLflow or W&B run."""

from __future__ import annotations

import json
import struct
import sys
import zlib

import pytest

from common.config import ConfigError, TrackingConfig
from common.tracking import CONFIG_FILE, Tracker, main, run_config_record, scalars
from pipeline.config import load_config, to_dict

pytest.importorskip("tensorboard")  # the optional extra `tracking`; scripts/setup.sh installs it for the suite
pytest.importorskip("mlflow")

STEP = {"record": "step", "step": 1, "loss": 0.5, "approx_kl": 0.01, "episodes_by_mode": {"on_policy": 4}, "ok": True}
EVAL = {"record": "eval", "step": 2, "mean_score": 25.0, "policy": "step_2"}


def _run_dir(tmp_path, records, partial: str = ""):
    run = tmp_path / "run"
    (run / CONFIG_FILE).parent.mkdir(parents=True)
    (run / CONFIG_FILE).write_text(
        json.dumps(run_config_record(to_dict(load_config(["learner.lr=3e-5"])), ["learner.lr=3e-5"]))
    )
    with open(run / "metrics.jsonl", "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records) + partial)
    return run


def _tensorboard(run) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tracking" / "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _mlflow(run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{run / 'tracking' / 'mlflow.db'}")
    run_id = (run / "tracking" / "mlflow_run_id").read_text()
    return client, client.get_run(run_id)


def _wandb_records(path) -> list:
    """The records of a W&B run file (.wandb): a 7-byte header (":W&B", magic 0xBEE1, version 0), then
    LevelDB-log records in 32 KiB blocks, each a 7-byte header (CRC-32 of its type byte and payload,
    length, type: 1 full, 2 first, 3 middle, 4 last) and a piece of a serialised wandb Record."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    block, pos, pieces, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        assert zlib.crc32(payload, zlib.crc32(bytes([kind]))) == crc, f"corrupt record at byte {pos}"
        pos += 7 + length
        pieces = payload if kind in (1, 2) else pieces + payload
        if kind in (1, 4):
            records.append(Record.FromString(pieces))
    return records


def _wandb(run) -> list[dict]:
    """Each W&B run directory under the run's tracking dir, oldest first, as {"id", "config", "rows"}:
    its config updates and its logged rows (W&B's own _-keys left out)."""
    out = []
    for run_file in sorted((run / "tracking" / "wandb").glob("offline-run-*/run-*.wandb")):
        found = {"id": None, "config": {}, "rows": []}
        for r in _wandb_records(run_file):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                found["id"] = r.run.run_id
            if kind in ("run", "config"):
                update = (r.run.config if kind == "run" else r.config).update
                found["config"].update({i.key: json.loads(i.value_json) for i in update})
            if kind == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                found["rows"].append({k: v for k, v in row.items() if not k.startswith("_")})
        out.append(found)
    return out


def test_a_records_numbers_are_its_scalars_under_its_kind():
    assert scalars(STEP) == (1, {"train/loss": 0.5, "train/approx_kl": 0.01, "train/episodes_by_mode/on_policy": 4.0})
    assert scalars(EVAL) == (2, {"eval/mean_score": 25.0})
    assert scalars({"record": "other", "step": 1, "x": 1}) is None


def test_both_backends_get_the_steps_and_evaluations_once_with_the_config_and_commit(tmp_path):
    run = _run_dir(tmp_path, [STEP, EVAL], partial='{"record": "step", "step": 3, "lo')
    tracker = Tracker(TrackingConfig(backends=["tensorboard", "mlflow"]), run)
    with open(run / "metrics.jsonl", "r+") as f:  # a foreign line before the half-written one: skipped
        text = f.read()
        f.seek(0)
        f.write(text.replace('{"record": "step", "step": 3', 'not json\n[1, 2]\n{"record": "step", "step": 3'))
    assert tracker.follow() == 2  # the half-written line waits
    assert tracker.follow() == 0  # nothing sent twice
    with open(run / "metrics.jsonl", "a") as f:
        f.write('ss": 0.25}\n')
    assert tracker.follow() == 1
    tracker.rollout(3, {"episodes": 12, "server_versions": [3]})
    tracker.close()

    scalars_tb = _tensorboard(run)
    assert scalars_tb["train/loss"] == [(1, 0.5), (3, 0.25)]
    assert scalars_tb["eval/mean_score"] == [(2, 25.0)]
    assert scalars_tb["rollout/episodes"] == [(3, 12.0)]
    client, found = _mlflow(run)
    assert [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, "train.loss")] == [
        (1, 0.5),
        (3, 0.25),
    ]
    assert found.data.params["learner.lr"] == "3e-05"
    assert found.data.tags["git_commit"] and found.data.tags["overrides"] == "learner.lr=3e-5"
    assert found.info.status == "FINISHED"


def test_a_resumed_run_is_the_same_mlflow_run_and_sends_only_what_is_new(tmp_path):
    run = _run_dir(tmp_path, [STEP])
    first = Tracker(TrackingConfig(backends=["mlflow"]), run)
    first.follow()
    first.close()
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({**STEP, "step": 2, "loss": 0.4}) + "\n")
    second = Tracker(TrackingConfig(backends=["mlflow"]), run)
    assert second.follow() == 1
    second.close()
    client, found = _mlflow(run)
    assert len(client.search_runs([found.info.experiment_id])) == 1
    assert [m.step for m in client.get_metric_history(found.info.run_id, "train.loss")] == [1, 2]


def test_wandb_gets_every_record_at_its_learner_step_with_the_config_and_commit_and_resumes_as_one_run(tmp_path):
    pytest.importorskip("wandb")
    late_eval = {**EVAL, "step": 1}  # an evaluation of step 1 written after step 2's record: kept, at step 1
    run = _run_dir(tmp_path, [STEP, {**STEP, "step": 2, "loss": 0.4}, late_eval])
    first = Tracker(TrackingConfig(backends=["wandb"]), run)
    assert first.follow() == 3
    first.rollout(2, {"episodes": 8})
    first.close()
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({**STEP, "step": 3, "loss": 0.3}) + "\n")
    second = Tracker(TrackingConfig(backends=["wandb"]), run)
    assert second.follow() == 1
    second.close()

    before, after = _wandb(run)
    assert before["id"] == after["id"] == (run / "tracking" / "wandb_run_id").read_text()
    assert [(r["learner_step"], r.get("train/loss"), r.get("eval/mean_score")) for r in before["rows"][:3]] == [
        (1, 0.5, None),
        (2, 0.4, None),
        (1, None, 25.0),
    ]
    assert before["rows"][3] == {"learner_step": 2, "rollout/episodes": 8.0}
    assert [(r["learner_step"], r["train/loss"]) for r in after["rows"]] == [(3, 0.3)]  # only what is new
    assert before["config"]["learner"]["lr"] == 3e-5 and before["config"]["overrides"] == "learner.lr=3e-5"
    assert before["config"]["git_commit"]


def test_online_wandb_without_credentials_is_refused_at_start(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))  # no `wandb login` settings
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    with pytest.raises(ConfigError, match=r"tracking.*wandb \(online\)"):
        Tracker(TrackingConfig(backends=["wandb"], wandb_mode="online"), _run_dir(tmp_path, []))


def test_a_backend_without_its_library_is_refused_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"tensorboard.*pip install -e '\.\[tracking\]'"):
        Tracker(TrackingConfig(backends=["tensorboard"]), _run_dir(tmp_path, []))


def test_empo2_track_refuses_a_directory_without_a_metrics_log_and_replays_a_run(tmp_path, capsys):
    assert main([str(tmp_path), "--backends", "tensorboard"]) == 2
    assert "not a run directory" in capsys.readouterr().err
    run = _run_dir(tmp_path, [STEP, EVAL])
    assert main([str(run), "--backends", "tensorboard"]) == 0
    assert "2 records" in capsys.readouterr().out
    assert _tensorboard(run)["train/approx_kl"] == [(1, pytest.approx(0.01))]


def test_an_unknown_or_repeated_backend_is_refused_at_load():
    with pytest.raises(ConfigError, match="tracking.backends"):
        load_config(["tracking.backends=[comet]"])
    with pytest.raises(ConfigError, match="twice"):
        load_config(["tracking.backends=[mlflow,mlflow]"])
    with pytest.raises(ConfigError, match="tracking.wandb_mode"):
        load_config(["tracking.wandb_mode=cloud"])


def test_the_launcher_sends_at_each_progress_line_and_a_failing_tracker_does_not_stop_the_run(tmp_path, capsys):
    from deploy.launch import Launcher

    run = _run_dir(tmp_path, [STEP])
    launcher = Launcher(load_config([f"run_dir={run}"]), [], roles=[])
    launcher.tracker = Tracker(TrackingConfig(backends=["tensorboard"]), run)
    launcher.track({"learner_steps": 1, "episodes": 4, "server_versions": [1]})
    launcher.tracker.close()
    assert _tensorboard(run)["rollout/episodes"] == [(1, 4.0)] and "train/loss" in _tensorboard(run)

    class Broken:
        def follow(self):
            raise OSError("disk full")

    launcher.tracker = Broken()
    launcher.track({"learner_steps": 2})
    assert "tracking failed (OSError: disk full); the run goes on" in capsys.readouterr().out
    assert launcher.metrics.tracking_failures._value.get() == 1
