"""The CPU learning profile (profile=cpu_learn) in the whole pipeline, shortened: EMPO2's memory engages.
Every group is a tip rollout of one variation, so once the first episodes' reflections are stored the
situation key finds them (the start state's room and empty inventory at least) and later episodes show
tips; with the profile's mask rule (off, for every arm) those tip turns are trained. Counted from the
run's metrics.jsonl (learner/memory_use.py, StepStats.tip_samples_trained_fraction) and its summary."""

from __future__ import annotations

import pytest

from common.metrics import read_log
from tests.helpers import run_to_its_end

pytestmark = pytest.mark.e2e
BASE = 34100  # metrics.base_port: server 34100, buffer 34200, memory 34201, launcher 34202, learner 34300, ...
OVERRIDES = [
    "profile=cpu_learn",
    "replay_buffer.variations_per_task=1",  # one memory (task, variation) that every group reads
    "replay_buffer.group_size=2",
    "replay_buffer.p_memory=1.0",
    "env.max_steps=5",  # short episodes: the memory's use is tested here, not success
    "learner.total_steps=3",
    "learner.checkpoint_every=0",
    "launch.timeout_s=1500",
    "endpoints.policy_servers=[tcp://127.0.0.1:33550]",
    "endpoints.replay_buffer=tcp://127.0.0.1:33560",
    "endpoints.memory_service=tcp://127.0.0.1:33570",
    f"metrics.base_port={BASE}",
    "launch.progress_every_s=15",
]
TIMEOUT_S = 1500


def test_tips_are_shown_and_trained_in_a_short_run_of_the_learning_profile(tmp_path):
    run, summary = run_to_its_end(OVERRIDES, tmp_path / "run", TIMEOUT_S)
    steps, _ = read_log(run.run_dir)
    assert len(steps) == run.cfg.learner.total_steps
    # some step trained on turns whose prompt showed tips, and kept them in the loss
    assert any(r["tip_turn_fraction"] and r["tip_samples"] for r in steps), steps
    tipped = [r for r in steps if r["tip_samples"]]
    assert all(r["tip_samples_trained_fraction"] == 1.0 for r in tipped)  # the mask is off for every arm
    assert all(r["retrieval_hits_mean"] is not None and r["r_int_spread_mean"] is not None for r in steps)
    assert summary["tips_shown"] > 0 and "turns showed tips" in summary["tips_note"], summary
