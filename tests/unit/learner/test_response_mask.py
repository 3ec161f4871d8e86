"""Tokens the actor put into a response (SGE's glue: Trajectory.response_mask 0) are part of the chain the
model read, scored with it, but never in the loss, the low-probability mask's judgement or the engines'
mismatch; their behaviour log-prob (a placeholder) changes nothing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from learner.config import LearnerConfig
from learner.policy_model import response_logprobs
from learner.samples import TurnSample, build_samples, sampled_tokens
from learner.step import PreScores, micro_batch_loss, sampled_logp_min
from protocol.messages import ON_POLICY, Trajectory, TurnRecord
from testing.factories import tiny_llama

PROMPT, RESPONSE = np.array([1, 2, 3, 4], np.int32), np.array([5, 6, 7, 8, 9], np.int32)
GLUE = np.array([0, 1, 1, 0, 1], np.uint8)  # an opening tag, two strategy tokens, a line break, the action


def test_only_the_sampled_tokens_are_trained_judged_and_compared():
    model = tiny_llama(40, seed=5, initializer_range=0.2)
    with torch.no_grad():
        own = response_logprobs(
            model, torch.from_numpy(PROMPT.astype(np.int64)), torch.from_numpy(RESPONSE.astype(np.int64))
        )
    behaviour = own.numpy().copy()
    sample = TurnSample(PROMPT, PROMPT, RESPONSE, behaviour, 1.5, ON_POLICY, 0, False, sampled=GLUE.astype(bool))
    cfg = LearnerConfig(low_prob_mask="off")

    def loss_and_grad(s: TurnSample):
        model.zero_grad()
        loss, totals = micro_batch_loss(model, [s], PreScores([None], None), cfg, version=0)
        loss.sum().backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]), totals

    loss, grad, totals = loss_and_grad(sample)
    assert totals.kept_tokens == 3 and totals.mismatch_tokens == 3  # the sampled ones
    assert loss.tolist() == pytest.approx([-1.5] * 3, abs=1e-4)  # ratio 1 on each sampled token
    moved = behaviour.copy()
    moved[GLUE == 0] = -50.0  # the glue's placeholder log-prob: anything
    loss2, grad2, totals2 = loss_and_grad(dataclasses.replace(sample, behaviour_logp=moved))
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(grad2, grad)
    assert totals2.mismatch == pytest.approx(totals.mismatch)
    # the same response with every token sampled trains five
    assert loss_and_grad(dataclasses.replace(sample, sampled=None))[2].kept_tokens == 5


def test_the_low_probability_mask_judges_the_sampled_tokens_only():
    sample = TurnSample(
        PROMPT, PROMPT, RESPONSE, np.zeros(5, np.float32), 1.0, ON_POLICY, 0, False, sampled=GLUE.astype(bool)
    )
    logp = torch.tensor([-9.0, -1.0, -2.0, -8.0, -0.5])
    assert sampled_logp_min(sample, logp) == -2.0
    assert sampled_logp_min(dataclasses.replace(sample, sampled=None), logp) == -9.0


def test_a_trajectorys_mask_reaches_its_turn_samples():
    turns = [
        TurnRecord(PROMPT, RESPONSE, np.zeros(5, np.float32), response_mask=GLUE, strategy="a plan"),
        TurnRecord(np.array([1, 2], np.int32), np.array([3], np.int32), np.zeros(1, np.float32)),
    ]
    traj = Trajectory.from_turns(
        turns,
        episode_id="e",
        group_id="g",
        slot=0,
        actor_id="a",
        task="t",
        variation=0,
        mode=ON_POLICY,
        score=1.0,
        done=False,
    )
    traj.validate()
    assert traj.strategies == ["a plan", ""] and traj.response_mask.tolist() == [*GLUE, 1]
    samples = build_samples([traj], 1.0, lambda ts: [np.zeros(t.num_turns) for t in ts], 1e-6)
    assert samples[0].sampled.tolist() == GLUE.astype(bool).tolist() and samples[1].sampled is None
    assert sampled_tokens(np.ones(3, np.uint8)) is None
