"""Trajectory.from_turns, the one place turns are packed into a trajectory's offset arrays."""

from __future__ import annotations

import numpy as np

from protocol import decode, encode
from protocol.messages import ON_POLICY_TIPS, Trajectory, TurnRecord


def test_turns_are_packed_at_their_offsets_and_survive_the_wire():
    turns = [
        TurnRecord(np.array([1, 2, 3]), np.array([7]), np.array([-0.5]), "s0", "look", 2, [(1, 2)], 1, True, "look!"),
        TurnRecord(
            np.array([1, 2, 3, 7, 4]),
            np.array([8, 9]),
            np.array([-0.1, -0.2]),
            "s1",
            "go",
            3,
            [(1, 2)],
            chain_start=False,
        ),
    ]
    traj = Trajectory.from_turns(
        turns,
        episode_id="e",
        group_id="g",
        slot=0,
        actor_id="a",
        task="boil",
        variation=1,
        mode=ON_POLICY_TIPS,
        score=0.0,
        done=False,
    )
    traj.validate()
    assert traj.prompt_offsets.tolist() == [0, 3, 8] and traj.response_offsets.tolist() == [0, 1, 3]
    assert traj.prompt_token_ids.dtype == np.int32 and traj.behaviour_logprobs.dtype == np.float32
    assert traj.tip_spans.tolist() == [[0, 1, 2], [1, 1, 2]] and traj.policy_versions.tolist() == [2, 3]
    assert traj.chain_starts.tolist() == [1, 0] and traj.extends_previous(1)
    assert traj.generated_texts == ["look!", "go"] and traj.observations == ["s0", "s1"]
    # a turn that leaves memory_retrieved unsaid: derived from the mode, as for a record written without it
    assert traj.memory_retrieved.tolist() == [1, 1]
    again = decode(encode(traj))
    assert again.prompt_offsets.tolist() == [0, 3, 8] and again.chain_starts.tolist() == [1, 0]
