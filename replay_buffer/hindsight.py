"""HeRL's group-level rules (Hindsight experience guided RL, arXiv 2603.20046; its released code,
sikelifei/HeRL), on ScienceWorld's 0-100 scores: which members of a complete GRPO group get a guided
revision, and which slot of the group a revision takes.

- Trigger: only a group none of whose members reached the top score (100: solved).
- Candidates: the members tied at the group's best score, at most `max_candidates` (herl.max_candidates).
- Insertion: one random slot of the group is replaced, by a revision scoring strictly above the
  group's best original, else by one scoring equal to it, else by a copy of the best original, which
  is then not marked as hindsight. The slot keeps the group id, so it takes part in the group's
  mean and std with its own score; the group size stays G.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from common.scienceworld import parse_goal_progress
from protocol.messages import MAX_GUIDANCE_CHARS, Trajectory

TOP_SCORE = 100.0
GUIDANCE_ACTIONS_SHOWN = 10  # the failed attempt's last actions quoted in its guidance


def hindsight_candidates(scores: list[float], max_candidates: int) -> list[int]:
    """The members (indices into `scores`) that get a guided revision: [] if any reached TOP_SCORE."""
    if not scores or max(scores) >= TOP_SCORE:
        return []
    best = max(scores)
    return [i for i, s in enumerate(scores) if s == best][:max_candidates]


@dataclass(frozen=True)
class Insertion:
    slot: int  # the group's slot replaced
    revision: int | None  # index into the revisions that takes it; None: a copy of the best original
    hindsight: bool  # its tokens are trained as hindsight tokens (learner/loss.py, hindsight_policy_loss)


def insertion(scores: list[float], revision_scores: list[float], rng: random.Random) -> Insertion:
    """Where the revisions go: `scores` the group's originals, `revision_scores` the guided episodes'."""
    best = max(scores)
    slot = rng.randrange(len(scores))
    for better in (lambda s: s > best, lambda s: s == best):
        chosen = [i for i, s in enumerate(revision_scores) if better(s)]
        if chosen:
            return Insertion(slot, max(chosen, key=lambda i: revision_scores[i]), True)
    return Insertion(slot, None, False)


def guidance_text(attempt: Trajectory) -> str:
    """What a revision of `attempt` is shown (Assignment.guidance; the actor adds the task
    description, whose object the generic subgoal descriptions leave out): the subgoals it satisfied
    and the ones it did not (its goal progress at the end), and its last actions. Never the
    variation's gold path: that would be imitation, not hindsight."""
    subgoals = parse_goal_progress(attempt.goal_progress)
    met = [s.description for s in subgoals if s.passed]
    unmet = [s.description for s in subgoals if not s.passed]
    shown = attempt.actions[-GUIDANCE_ACTIONS_SHOWN:]
    lines = [
        f"An earlier attempt scored {attempt.score:g}.",
        "It achieved: " + ("; ".join(met) if met else "none of the subgoals"),
        "It missed: " + ("; ".join(unmet) if unmet else "no recorded subgoal"),
        f"Its last {len(shown)} actions: " + ", ".join(shown),
        "Keep what it achieved and do what it missed.",
    ]
    return "\n".join(lines)[:MAX_GUIDANCE_CHARS]
