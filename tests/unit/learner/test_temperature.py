"""A response sampled at temperature T is scored at T: its behaviour log-probs (vLLM's processed
log-probs) are of softmax(logits / T), and so are the learner's, so the importance ratio at the
behaviour weights is exactly 1 at any temperature, packed or not. On a tiny model where the answer is
computed by hand: tokens drawn from the tempered distribution, the ratio 1 at T, and not 1 when the
same tokens are scored at 1 (what the learner did before)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from learner.policy_model import Scored, batch_log_softmax, token_logprobs
from learner.samples import build_samples
from learner.step import chain
from protocol.messages import ON_POLICY, Trajectory, TurnRecord
from testing.factories import tiny_llama

VOCAB = 40


@pytest.fixture(scope="module")
def model():
    return tiny_llama(VOCAB, seed=11, initializer_range=0.3).eval()


def _sampled(model, prompt: np.ndarray, steps: int, temperature: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens drawn one by one from softmax(logits / T) and their log-probs under it: what the policy
    server returns with logprobs_mode=processed_logprobs."""
    gen = torch.Generator().manual_seed(seed)
    ids, logps = torch.from_numpy(prompt.astype(np.int64)), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(ids[None]).logits[0, -1] / temperature
            logp = torch.log_softmax(logits, -1)
            token = torch.multinomial(logp.exp(), 1, generator=gen)
            logps.append(float(logp[token]))
            ids = torch.cat([ids, token])
    return ids[len(prompt) :].numpy().astype(np.int32), np.asarray(logps, np.float32)


def _score(model, seqs: list[Scored]) -> np.ndarray:
    targets = torch.from_numpy(np.concatenate([s.targets() for s in seqs]).astype(np.int64))
    with torch.no_grad():
        return token_logprobs(batch_log_softmax(model, [[s] for s in seqs]), targets).numpy()


@pytest.mark.parametrize("temperature", [0.4, 1.0, 1.7])
def test_the_ratio_at_the_behaviour_weights_is_one_at_any_temperature(model, temperature):
    prompt = np.arange(3, 12, dtype=np.int32)
    response, behaviour = _sampled(model, prompt, 6, temperature, seed=int(temperature * 10))
    tokens = np.concatenate([prompt, response])
    at_t = _score(model, [Scored(tokens, [(len(prompt), len(response))], [np.full(len(response), temperature)])])
    np.testing.assert_allclose(at_t, behaviour, atol=1e-5)  # ratio exp(0) = 1
    at_one = _score(model, [Scored(tokens, [(len(prompt), len(response))])])
    if temperature != 1.0:  # scored untempered, the same tokens give another ratio
        assert np.abs(at_one - behaviour).max() > 0.05


def test_a_chain_of_turns_at_different_temperatures_scores_each_token_at_its_own(model):
    """Packing (learner.packing): two turns in one sequence, sampled at 0.5 and 1.5, scored in one
    forward equal each turn scored alone at its temperature; and batched beside a sequence at 1. A
    response whose parts were sampled at two temperatures is scored token by token."""
    p0 = np.arange(2, 9, dtype=np.int32)
    r0, b0 = _sampled(model, p0, 4, 0.5, seed=1)
    p1 = np.concatenate([p0, r0, np.array([30, 31], np.int32)])
    r1, b1 = _sampled(model, p1, 3, 1.5, seed=2)
    temps = [np.full(len(r0), 0.5), np.full(len(r1), 1.5)]
    packed = Scored(np.concatenate([p1, r1]), [(len(p0), len(r0)), (len(p1), len(r1))], temps)
    plain = Scored(np.concatenate([p0, r0]), [(len(p0), len(r0))])  # at 1
    scored = _score(model, [packed, plain])
    np.testing.assert_allclose(scored[: len(r0) + len(r1)], np.concatenate([b0, b1]), atol=1e-5)
    alone = _score(model, [plain])
    np.testing.assert_allclose(scored[len(r0) + len(r1) :], alone, atol=1e-5)
    # one response: its first 4 tokens at 0.5, the next 3 at 1.5 (a strategy, then an action)
    mixed = Scored(np.concatenate([p0, r0, r1]), [(len(p0), len(r0) + len(r1))], [np.concatenate(temps)])
    tokens = np.concatenate([p0, r0, r1])
    first = _score(model, [Scored(tokens, [(len(p0), len(r0))], [temps[0]])])
    second = _score(model, [Scored(tokens, [(len(p0) + len(r0), len(r1))], [temps[1]])])
    np.testing.assert_allclose(_score(model, [mixed]), np.concatenate([first, second]), atol=1e-5)


def test_samples_carry_the_sampled_temperature_and_greedy_is_scored_at_one():
    turns = [
        TurnRecord(np.array([1, 2], np.int32), np.array([3, 4], np.int32), np.full(2, -0.5, np.float32), temperature=t)
        for t in (0.7, 0.0)
    ]
    traj = Trajectory.from_turns(
        turns, episode_id="e", group_id="g", slot=0, actor_id="a", task="t", variation=0, mode=ON_POLICY, score=0.0,
        done=False,
    )  # fmt: skip
    traj.validate()
    assert traj.temperatures.tolist() == pytest.approx([0.7, 0.7, 0.0, 0.0])  # one per response token
    samples = build_samples([traj], score_scale=1.0, intrinsic=lambda ts: [np.zeros(t.num_turns) for t in ts], eps=1e-6)
    assert [s.temperatures.tolist() for s in samples] == [pytest.approx([0.7, 0.7]), [1.0, 1.0]]
    assert chain(samples[:1]).temperatures[0].tolist() == pytest.approx([0.7, 0.7])


def test_a_trajectory_without_temperatures_is_at_one_and_a_bad_one_is_refused():
    from protocol import ProtocolError

    turn = TurnRecord(np.array([1, 2], np.int32), np.array([3], np.int32), np.array([-0.5], np.float32))
    fields = dict(episode_id="e", group_id="g", slot=0, actor_id="a", task="t", variation=0, mode=ON_POLICY)
    traj = Trajectory.from_turns([turn], **fields, score=0.0, done=False)
    traj.temperatures = None
    traj.__post_init__()  # as a record written before temperatures existed is read
    assert traj.temperatures.tolist() == [1.0]  # its one response token
    for bad in (np.array([np.nan], np.float32), np.array([-1.0], np.float32), np.array([1.0, 1.0], np.float32)):
        traj.temperatures = bad
        with pytest.raises(ProtocolError, match="temperatures"):
            traj.validate()
