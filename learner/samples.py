"""From trajectories to per-turn training samples, with the prompt each mode is updated on.

Each turn is one sample: (prompt at that turn, its ≤32-token response). For the off-policy mode
the tips are cut out of the prompt at the token level (the spans the actor recorded), so the
learner scores log πθ(a | s) while the behaviour log-prob stays log πθold(a | s, tips).

A sample that `continues` the one before it (the same episode's previous turn, whose prompt and
response its prompt starts with: Trajectory.chain_starts) is scored in the same sequence as that
turn when learner.packing is episode or group (learner/step.py): the chain is scored once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from learner.advantages import (
    TIP_MODES,
    IntrinsicReward,
    anchor_step_advantages,
    discounted_returns,
    group_advantages,
    turn_rewards,
)
from protocol.messages import GUIDED, OFF_POLICY, Trajectory

GREEDY_BELOW = 1e-5  # vLLM samples greedily below this temperature (its _SAMPLING_EPS)


@dataclass
class TurnSample:
    update_prompt: np.ndarray  # int32 [P'] prompt scored for the gradient (tips removed if off-policy)
    tipfree_prompt: np.ndarray  # int32 [P''] prompt without any tip: the low-probability mask's
    response: np.ndarray  # int32 [T]
    behaviour_logp: np.ndarray  # float32 [T] log πθold from the policy server
    advantage: float
    mode: str
    policy_version: int  # version that generated the response
    with_tips: bool  # the rollout showed tips in this turn's prompt
    # the previous sample's update prompt + response is a prefix of this one's update prompt (and so is its
    # tip-free prompt + response of this tip-free prompt): the two are scored in one sequence when packed
    continues: bool = False
    # float32 [T]: the temperature each response token was sampled at, which it is scored at
    # (Trajectory.temperatures; greedy's 0 is 1, as the server reports it); None: all at 1
    temperatures: np.ndarray | None = None
    # HeRL: a revision that took a slot of its group (Trajectory.hindsight): its tokens train as hindsight
    # tokens (learner/loss.py, hindsight_policy_loss); `guidance_stripped`: its guidance was removed from the
    # update prompt (herl.train_context=stripped)
    hindsight: bool = False
    guidance_stripped: bool = False
    # bool [T]: the response tokens the policy sampled (Trajectory.response_mask); the others (SGE's glue,
    # put in by the actor) are scored as part of the chain but never trained or judged; None: all sampled
    sampled: np.ndarray | None = None

    @property
    def update_is_behaviour_prompt(self) -> bool:
        """The learner scores exactly what the server scored (lets us measure log-prob mismatch)."""
        return not (self.mode == OFF_POLICY and self.with_tips or self.guidance_stripped)


def remove_spans(prompt: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    keep = np.ones(len(prompt), dtype=bool)
    for start, end in spans:
        keep[start:end] = False
    return prompt[keep]


@dataclass
class GiGPO:
    """Step-level anchor-state advantage on top of GRPO's (learner/advantages.py), from
    learner.gigpo_gamma, gigpo_step_weight and gigpo_step_norm."""

    gamma: float
    step_weight: float
    norm: str  # "std" | "mean"


def group_turn_advantages(
    members: list[Trajectory], score_scale: float, intrinsic: list[np.ndarray], eps: float, gigpo: GiGPO | None = None
) -> list[np.ndarray]:
    """[turns] advantage of each member, given each member's [turns] intrinsic reward."""
    rewards = [turn_rewards(t, score_scale, r_int) for t, r_int in zip(members, intrinsic)]
    advantages = group_advantages(rewards, eps)
    if gigpo is None:
        return advantages
    returns = [discounted_returns(t, score_scale, r_int, gigpo.gamma) for t, r_int in zip(members, intrinsic)]
    steps = anchor_step_advantages(members, returns, gigpo.norm, eps)
    return [a + gigpo.step_weight * s for a, s in zip(advantages, steps)]


def scoring_temperatures(sampled: np.ndarray) -> np.ndarray:
    """The temperatures response tokens are scored at: those they were sampled at, where vLLM's processed
    log-probs are of logits / T; greedy sampling (T below vLLM's 1e-5) reports untempered ones."""
    return np.where(sampled >= GREEDY_BELOW, sampled, 1.0).astype(np.float32)


def sampled_tokens(mask: np.ndarray) -> np.ndarray | None:
    """TurnSample.sampled of a turn's response mask: None when every token was sampled (the usual turn)."""
    return None if bool(np.all(mask == 1)) else mask.astype(bool)


def finite_samples(samples: list[TurnSample]) -> tuple[list[TurnSample], int]:
    """(the samples whose advantage and behaviour log-probs are finite, how many were dropped):
    defence in depth behind the replay buffer's door (protocol/messages.py, Trajectory.validate),
    so a NaN never reaches the loss and the optimizer (issue 14)."""
    kept = [s for s in samples if np.isfinite(s.advantage) and bool(np.all(np.isfinite(s.behaviour_logp)))]
    return kept, len(samples) - len(kept)


def build_samples(
    trajectories: list[Trajectory],
    score_scale: float,
    intrinsic: IntrinsicReward,
    eps: float,
    gigpo: GiGPO | None = None,
    strip_guidance: bool = False,
) -> list[TurnSample]:
    """Every turn of every episode as a sample with its group's advantage. The update prompt: tips removed
    for off-policy; a guided episode's guidance removed with `strip_guidance` (herl.train_context=stripped)."""
    bonus = intrinsic(trajectories)  # [turns] r_int per episode, one call per batch (RND trains on it)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, traj in enumerate(trajectories):
        groups[traj.group_id].append(i)
    samples = []
    for indices in groups.values():
        members = [trajectories[i] for i in indices]
        for traj, advantages in zip(
            members, group_turn_advantages(members, score_scale, [bonus[i] for i in indices], eps, gigpo)
        ):
            for i in range(traj.num_turns):
                prompt, spans = traj.turn_prompt(i), traj.turn_tip_spans(i)
                tipfree = remove_spans(prompt, spans)
                stripped = traj.mode == GUIDED and strip_guidance and bool(spans)
                samples.append(
                    TurnSample(
                        update_prompt=tipfree if traj.mode == OFF_POLICY or stripped else prompt,
                        tipfree_prompt=tipfree,
                        response=traj.turn_response(i),
                        behaviour_logp=traj.turn_behaviour_logprobs(i),
                        advantage=float(advantages[i]),
                        mode=traj.mode,
                        policy_version=int(traj.policy_versions[i]),
                        with_tips=bool(spans) and traj.mode in TIP_MODES,
                        continues=not traj.chain_starts[i],
                        temperatures=scoring_temperatures(traj.turn_temperatures(i)),
                        hindsight=traj.hindsight,
                        guidance_stripped=stripped,
                        sampled=sampled_tokens(traj.turn_response_mask(i)),
                    )
                )
    return samples
