"""learner/distributed.py in a plain process: a group of one, a clear refusal of CUDA without a
GPU, the broadcast on rank 0 (the other ranks' decoding runs in tests/integration/test_learner_fsdp.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learner import distributed
from protocol.messages import Batch
from testing.factories import mixed_group


def test_a_plain_process_is_a_group_of_one():
    assert distributed.init("cpu") == torch.device("cpu")
    assert (distributed.rank(), distributed.world_size()) == (0, 1)
    assert distributed.synced([[0, 1], [2]]) == [[0, 1], [2]]  # nothing to pad alone
    assert distributed.all_reduce([1.5, 2.0]) == [1.5, 2.0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_cuda_without_a_gpu_fails_clearly():
    with pytest.raises(RuntimeError, match="learner.device=cuda but torch sees no CUDA device"):
        distributed.init("cuda")


def test_broadcast_returns_the_batch():
    batch = Batch(mixed_group(0), dropped_stale=2)
    out = distributed.broadcast_message(batch)
    assert out.dropped_stale == 2 and len(out.trajectories) == 4
    np.testing.assert_array_equal(out.trajectories[1].prompt_token_ids, batch.trajectories[1].prompt_token_ids)
