"""The synchronous baseline (pipeline.mode=sync) for real: the launcher starts every role as its own
process (vLLM policy server, ScienceWorld env actors, replay buffer, memory service, learner) on
the e2e profile's short episodes, without memory (p = 0: no reflection runs on the policy server),
for 2 learner steps, while this test polls the policy server's generation metrics exactly as
benchmarks/async_vs_sync.py does (testing/lockstep.py: polled_run and lockstep_audit):

  - every trained turn has staleness 0 (the learner's metrics log, one record per step)
  - no token is generated, and no request is in flight, while the learner steps (its busy
    intervals from the same log, against the polls of the policy server)
"""

from __future__ import annotations

import pytest

from testing.lockstep import lockstep_audit, polled_run, step_records
from tests.helpers import REPO

pytestmark = pytest.mark.e2e
STEPS = 2
OVERRIDES = [
    "profile=e2e",
    "pipeline.mode=sync",
    "replay_buffer.p_memory=0.0",
    "replay_buffer.max_open_groups=2",  # room to play ahead, which sync mode must not use
    "replay_buffer.max_ready_groups=2",
    "learner.max_staleness=4",
    f"learner.total_steps={STEPS}",
    "endpoints.policy_servers=[tcp://127.0.0.1:10550]",
    "endpoints.replay_buffer=tcp://127.0.0.1:10560",
    "endpoints.memory_service=tcp://127.0.0.1:10570",
    "metrics.base_port=6100",
    "launch.timeout_s=900",  # the launcher stops every role by then, whatever happens
]


def test_sync_mode_trains_on_fresh_turns_and_never_generates_while_the_learner_steps(tmp_path):
    run_dir = tmp_path / "sync"
    polls = polled_run(OVERRIDES, run_dir, cwd=REPO)
    launch_out = (run_dir / "launch.out").read_text()
    steps = step_records(run_dir)
    assert len(steps) == STEPS, launch_out[-5000:]
    assert all(r["staleness_max_versions"] == 0 for r in steps), [r["staleness_max_versions"] for r in steps]
    assert polls and polls[-1][1] > 0, "the policy server's metrics were never read, or it generated nothing"
    audit = lockstep_audit(steps, polls)
    assert audit["steps_checked"] >= 1, audit  # at least one step long enough to hold polls inside it
    assert audit["generated_tokens_during_learner_steps"] == 0, audit
    assert audit["polls_with_requests_in_flight_during_learner_steps"] == 0, audit
