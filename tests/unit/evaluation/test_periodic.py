"""The periodic evaluation's choices without processes: which checkpoint is due, the child's
overrides (its own server and metrics block), where the launcher puts it, what validation refuses."""

from __future__ import annotations

import pytest

from common.config import ConfigError
from evaluation.periodic import due_checkpoint, eval_overrides
from pipeline.config import load_config, validate
from pipeline.roles import run_roles


def _cfg(tmp_path, *extra):
    return load_config([f"run_dir={tmp_path}", "eval.every_steps=4", "learner.checkpoint_every=2", *extra])


def _checkpoint(tmp_path, step):
    path = tmp_path / "checkpoints" / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "trainer_state.pt").write_bytes(b"")
    return path


def test_only_the_newest_checkpoint_of_a_due_step_is_scored_once(tmp_path):
    cfg = _cfg(tmp_path)
    assert due_checkpoint(cfg, set()) is None
    _checkpoint(tmp_path, 2)
    assert due_checkpoint(cfg, set()) is None  # 2 is not a multiple of 4
    four = _checkpoint(tmp_path, 4)
    assert due_checkpoint(cfg, set()) == four
    assert due_checkpoint(cfg, {"step_000004"}) is None
    _checkpoint(tmp_path, 6)
    _checkpoint(tmp_path, 8)
    assert due_checkpoint(cfg, {"step_000004"}).name == "step_000008"


def test_the_child_evaluation_scores_the_subset_on_its_own_server(tmp_path):
    cfg = _cfg(tmp_path, "eval.subset_tasks=[find-animal]", "eval.subset_variations=3")
    overrides = eval_overrides(cfg, ["profile=cpu"], tmp_path / "checkpoints" / "step_000004")
    child = load_config(overrides)
    assert child.eval.tasks == ["find-animal"] and child.eval.variations == 3 and child.eval.every_steps == 0
    assert child.endpoints.policy_servers == [cfg.eval.server_endpoint]
    assert child.metrics.base_port == cfg.eval.metrics_base_port != cfg.metrics.base_port
    assert child.eval.policy.endswith("step_000004")


def test_the_launcher_starts_the_evaluator_before_the_learner_only_when_asked(tmp_path):
    names = [spec.name for spec in run_roles(_cfg(tmp_path))]
    assert names[-2:] == ["evaluator", "learner"]
    assert "evaluator" not in [spec.name for spec in run_roles(load_config([f"run_dir={tmp_path}"]))]


def test_validation_of_the_periodic_evaluation(tmp_path):
    with pytest.raises(ConfigError, match="eval.every_steps"):
        load_config(["eval.every_steps=3", "learner.checkpoint_every=2"])
    with pytest.raises(ConfigError, match="eval.metrics_base_port"):
        load_config(["eval.every_steps=2", "learner.checkpoint_every=2", "eval.metrics_base_port=9500"])
    cfg = _cfg(tmp_path)
    cfg.eval.server_endpoint = cfg.endpoints.policy_servers[0]
    with pytest.raises(ConfigError, match="eval.server_endpoint"):
        validate(cfg)
