"""Semantic validation (issue 14): every well-formed but wrong message that the servers used to
acknowledge is refused by decode's validate() or by the server-side DoorLimits check, with a reason."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from protocol.codec import ProtocolError, decode, encode
from protocol.messages import (
    Ack,
    AssignmentRequest,
    AssignmentReturn,
    BatchRequest,
    DoorLimits,
    EpisodeReport,
    GenerateRequest,
    LeaseRenewal,
    MemoryQuery,
    MemoryResult,
)
from testing.factories import make_trajectory

TRAJECTORY_MUTATIONS = {
    "float32 offsets": lambda t: dataclasses.replace(t, prompt_offsets=t.prompt_offsets.astype(np.float32)),
    "int32 offsets": lambda t: dataclasses.replace(t, response_offsets=t.response_offsets.astype(np.int32)),
    "offsets not from 0": lambda t: dataclasses.replace(t, prompt_offsets=t.prompt_offsets + 1),
    "2-D token ids": lambda t: dataclasses.replace(
        t,
        prompt_token_ids=np.stack([t.prompt_token_ids, t.prompt_token_ids]),
        prompt_offsets=t.prompt_offsets * 2,
    ),
    "negative token id": lambda t: dataclasses.replace(t, response_token_ids=-t.response_token_ids),
    "NaN score": lambda t: dataclasses.replace(t, score=float("nan"), success=False),
    "infinite score": lambda t: dataclasses.replace(t, score=float("inf"), success=True),
    "score out of range": lambda t: dataclasses.replace(t, score=1e9, success=True),
    "NaN log-prob": lambda t: dataclasses.replace(t, behaviour_logprobs=np.full_like(t.behaviour_logprobs, np.nan)),
    "-inf log-prob": lambda t: dataclasses.replace(t, behaviour_logprobs=np.full_like(t.behaviour_logprobs, -np.inf)),
    "positive log-prob": lambda t: dataclasses.replace(t, behaviour_logprobs=-t.behaviour_logprobs),
    "int32-min version": lambda t: dataclasses.replace(
        t, policy_versions=np.full_like(t.policy_versions, np.iinfo(np.int32).min)
    ),
    "negative slot": lambda t: dataclasses.replace(t, slot=-1),
    "huge episode id": lambda t: dataclasses.replace(t, episode_id="e" * 100_000),
    "2-D versions": lambda t: dataclasses.replace(t, policy_versions=t.policy_versions.reshape(1, -1)),
}


def test_the_unmutated_trajectory_decodes():
    decode(encode(make_trajectory()))


@pytest.mark.parametrize("mutation", sorted(TRAJECTORY_MUTATIONS))
def test_wrong_trajectory_is_refused_by_decode(mutation):
    bad = TRAJECTORY_MUTATIONS[mutation](make_trajectory())
    with pytest.raises(ProtocolError) as info:
        decode(encode(bad))
    assert info.value.reason == "invalid"


LIMITS = DoorLimits(
    vocab_size=600,
    tasks=frozenset({"find-living-thing"}),
    max_turns=4,
    max_observation_len=100,
    max_action_len=20,
    max_state_len=100,
    max_task_description_len=50,
)


@pytest.mark.parametrize(
    "message, reason",
    [
        (make_trajectory(), None),
        (dataclasses.replace(make_trajectory(), task="boil"), "task"),
        (make_trajectory(prompt_lens=(1,) * 5, response_lens=(1,) * 5), "too_long"),
        (dataclasses.replace(make_trajectory(), observations=["x" * 101, "o"]), "too_long"),
        (dataclasses.replace(make_trajectory(), actions=["x" * 21, "a"]), "too_long"),
        (
            dataclasses.replace(make_trajectory(), response_token_ids=np.full(6, 600, np.int32)),
            "vocab",
        ),
        (MemoryQuery(task="find-living-thing", variation=0, state="s" * 101), "too_long"),
        (MemoryQuery(task="task-0042", variation=0, state="s"), "task"),
        (GenerateRequest("r", np.array([1, 600], np.int32), 1, 0.0, 0), "vocab"),
        (
            EpisodeReport("e", "find-living-thing", 0, "d" * 51, 5.0, ["o"], ["a"]),
            "too_long",
        ),
    ],
)
def test_door_limits(message, reason):
    decoded = decode(encode(message))  # passes validate(): only the server's knowledge refuses it
    if reason is None:
        decoded.check(LIMITS)
        return
    with pytest.raises(ProtocolError) as info:
        decoded.check(LIMITS)
    assert info.value.reason == reason


@pytest.mark.parametrize(
    "message",
    [
        EpisodeReport("e", "boil", 0, "d", float("nan"), ["o"], ["a"]),
        EpisodeReport("e", "boil", 0, "d", 1e300, ["o"], ["a"]),
        MemoryResult(tips=["t"], scores=[float("nan")], count=1),
        BatchRequest(learner_version=-5, num_groups=1, max_staleness=0),
        BatchRequest(learner_version=0, num_groups=0, max_staleness=0),
        GenerateRequest("r", np.array([-1], np.int32), 1, 0.0, 0),
        LeaseRenewal(actor_id="actor0", incarnation=""),  # a renewal names its incarnation
        LeaseRenewal(actor_id="actor0", incarnation="i", group_id="g", slot=-1),
        LeaseRenewal(actor_id="actor0", incarnation="i" * 257),
        AssignmentReturn(group_id="g", slot=-1, actor_id="actor0"),
        AssignmentRequest(actor_id="actor0", incarnation="i" * 257),
    ],
)
def test_other_wrong_messages_are_refused_by_decode(message):
    with pytest.raises(ProtocolError, match="invalid"):
        decode(encode(message))


def test_an_ack_says_whether_it_was_a_duplicate():
    assert decode(encode(Ack(ref="e"))).duplicate is False
    assert decode(encode(Ack(ref="e", duplicate=True))).duplicate is True
