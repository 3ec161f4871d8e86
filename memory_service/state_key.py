"""What text of a state the memory embeds as its key (memory_service.state_key).

`observation` (the paper): the state text the agent is shown, the action's feedback plus the room's
look text. In ScienceWorld the look text dominates it: MiniLM's cosine between real states of one task
is high whatever the situation (benchmarks/state_keys.py), so the paper's threshold of 0.5 passes 65-72%
of the pairs of different situations: a state is shown the best-scored tips of most of the task, and
n saturates at top_k.

`situation` (a departure, documented in docs/fidelity.md): the room the agent is in and what it
carries, the parts of a ScienceWorld state that the agent's actions change. Two states of the same
situation get the same key (cosine 1); the threshold that separates situations is chosen from the
measured distribution (benchmarks/results/state_keys.json).
"""

from __future__ import annotations

from common.scienceworld import room_of
from memory_service.config import StateKey

_INVENTORY_HEADER = "In your inventory, you see:"


def situation_text(state: str, inventory: str) -> str:
    """'in the kitchen, carrying an orange, a thermometer': the room of the state's look text and the
    inventory's items (ScienceWorld's inventory text without its header), in the order the env lists them."""
    room = room_of(state) or "unknown room"
    items = [line.strip() for line in inventory.replace(_INVENTORY_HEADER, "").splitlines() if line.strip()]
    return f"in the {room}, carrying {', '.join(items) if items else 'nothing'}"


def key_text(kind: StateKey | str, state: str, inventory: str) -> str:
    """The text embedded for a state under `kind`."""
    return situation_text(state, inventory) if StateKey(kind) is StateKey.situation else state
