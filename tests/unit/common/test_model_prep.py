"""A hub model (common/model_prep.py): found in the Hugging Face cache by every role, fetched only by the
command that starts a run where the hub is allowed; a model the cache lacks where it is not is refused
at once with the command that fixes it, by empo2-run before any role starts. (The fetch itself needs
the hub, which this machine does not reach: not run here.)"""

from __future__ import annotations

import huggingface_hub.constants
import pytest

from common.model_prep import hub_allowed, resolve_model
from deploy.launch import main as launch_main
from pipeline.config import load_config

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache of this test's own (the layout huggingface_hub writes)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def test_a_cached_hub_model_resolves_to_its_snapshot_without_the_hub(hf_cache):
    repo = hf_cache / "models--org--tiny-policy"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    assert resolve_model("org/tiny-policy") == str(snapshot)


def test_a_hub_model_the_cache_lacks_is_refused_with_the_command_that_fetches_it(hf_cache):
    with pytest.raises(RuntimeError, match=r"not in the Hugging Face cache.*empo2-prepare-model --model org/absent"):
        resolve_model("org/absent")
    with pytest.raises(RuntimeError, match="neither a directory nor a Hugging Face Hub name"):
        resolve_model("no//such dir")


def test_empo2_run_refuses_it_before_any_role_starts(hf_cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config([f"run_dir={tmp_path / 'run'}", "model.name=org/absent"])
    assert launch_main([], cfg) == 2
    assert "empo2-prepare-model --model org/absent" in capsys.readouterr().err
    assert not (tmp_path / "run" / "logs").exists()  # no role was started


def test_the_hub_is_allowed_unless_hf_hub_offline_says_otherwise(monkeypatch):
    for value, allowed in (("1", False), ("true", False), ("ON", False), ("0", True), ("", True)):
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        assert hub_allowed() is allowed, value
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert hub_allowed()
