"""The learner's Trainer under torchrun (2 CPU ranks, gloo, FSDP2) takes the same steps as one
plain process: same updated weights for the same batches; a checkpoint written by the 2 ranks
resumes on both and gives the step the run took without the interruption.

The worker half of this file runs under `torchrun --nproc_per_node=2` and as a plain process;
each run writes its final full weights for the test to compare. Processes always end: each run
is its own session: SIGTERM to the group (torchrun stops its ranks, which run in sessions of
their own), then SIGKILL, after the run or its timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.process import stop_group
from testing.factories import mixed_group, save_tiny_model
from tests.helpers import REPO, free_port

pytestmark = pytest.mark.integration


def worker(model_dir: str, out: str) -> None:
    """Step, checkpoint, step; then resume from the checkpoint and take the last step again. The
    batches reach the other ranks as the learner sends them: broadcast from rank 0."""
    from safetensors.torch import save_file

    from learner import distributed
    from learner.config import LearnerConfig
    from learner.train import Trainer
    from protocol.messages import Batch

    cfg = LearnerConfig(
        lr=1e-3,
        total_steps=4,
        lr_schedule="linear",
        micro_batch_tokens=48,
        low_prob_threshold=-3.0,
        low_prob_mask="tip_rollouts",  # the mask of the docstring: tip samples only (the paper's would drop all)
        intrinsic_kind="rnd",
        device="cpu",
    )
    trainer = Trainer(cfg, model_dir, seed=0)
    batches = [
        distributed.broadcast_message(Batch(mixed_group(k), 0) if distributed.rank() == 0 else None) for k in range(2)
    ]
    trainer.step(batches[0].trajectories)
    checkpoint = trainer.save_checkpoint(Path(out) / "checkpoints", keep_last=1)
    trainer.step(batches[1].trajectories)
    final = trainer.full_weights()
    resumed_from = sorted((Path(out) / "checkpoints").glob("step_*"))[-1]  # written by rank 0, read by every rank
    resumed = Trainer(cfg, str(resumed_from), seed=0, resume_from=resumed_from)
    resumed.step(batches[1].trajectories)
    again = resumed.full_weights()
    if distributed.rank() == 0:
        assert checkpoint == resumed_from
        save_file({k: v.clone() for k, v in final.items()}, str(Path(out) / "final.safetensors"))
        save_file({k: v.clone() for k, v in again.items()}, str(Path(out) / "resumed.safetensors"))
    distributed.close()


def _run(command: list[str], out: Path, timeout: float = 120) -> None:
    env = dict(
        os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false"
    )
    out.mkdir()
    with open(out / "log.txt", "wb") as log:
        proc = subprocess.Popen(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            stop_group(proc, grace_s=15)
    assert rc == 0, (out / "log.txt").read_text()[-4000:]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def test_two_ranks_take_the_single_process_steps(model_dir, tmp_path):
    from safetensors.torch import load_file

    script = str(Path(__file__).resolve())
    _run([sys.executable, script, model_dir, str(tmp_path / "one")], tmp_path / "one")
    # A rank sometimes aborts as its process exits, after the run's work is written ("terminate called
    # without an active exception", exit -6: 1 in 16 runs on 2 loaded cores, once in CI, 2026-12-06;
    # the cause is not found). That abort alone earns one more try; any other failure, or the same
    # abort twice, fails the test.
    for attempt in range(2):
        out = tmp_path / f"two{attempt}"
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1"]
        try:
            _run([*command, f"--master_port={free_port()}", script, model_dir, str(out)], out)
            break
        except AssertionError:
            if attempt or "terminate called without an active exception" not in (out / "log.txt").read_text():
                raise
    one, two = (
        load_file(str(tmp_path / "one" / "final.safetensors")),
        load_file(str(out / "final.safetensors")),
    )
    initial = load_file(str(Path(model_dir) / "model.safetensors"))
    assert one.keys() == two.keys()
    assert any(not torch.equal(one[k], initial[k]) for k in initial)  # the steps moved the weights
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-6, msg=name)
    for run in (tmp_path / "one", out):  # resumed from the step-1 checkpoint: step 2 as the uninterrupted run took it
        final, resumed = (load_file(str(run / f)) for f in ("final.safetensors", "resumed.safetensors"))
        for name in final:
            torch.testing.assert_close(resumed[name], final[name], rtol=0, atol=0, msg=f"{run.name}: {name}")


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
