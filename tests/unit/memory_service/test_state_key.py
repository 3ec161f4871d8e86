"""The memory's state key (memory_service/state_key.py): the paper's observation text, or the situation
(room and inventory) that tells ScienceWorld's states apart."""

from __future__ import annotations

from memory_service.config import MemoryServiceConfig, StateKey
from memory_service.state_key import key_text, situation_text

# a state as the actor sees it: the action's feedback, then the room's look text
KITCHEN = (
    "You move to the kitchen.\nThis room is called the kitchen. In it, you see: \n\tthe agent\n\ta fridge\n"
    "You also see:\n\tA door to the hallway (that is open)\n"
)
KITCHEN_AFTER_LOOK = KITCHEN.replace("You move to the kitchen.", "You look around.")
HALLWAY = KITCHEN.replace("kitchen", "hallway")
INVENTORY = "In your inventory, you see:\n\tan orange\n\ta thermometer\n"


def test_the_situation_is_the_room_and_what_the_agent_carries():
    assert situation_text(KITCHEN, INVENTORY) == "in the kitchen, carrying an orange, a thermometer"
    assert situation_text(KITCHEN, "In your inventory, you see:\n") == "in the kitchen, carrying nothing"
    assert situation_text("no look text here", "") == "in the unknown room, carrying nothing"


def test_states_of_one_situation_share_a_key_and_other_situations_do_not():
    same = {key_text(StateKey.situation, s, INVENTORY) for s in (KITCHEN, KITCHEN_AFTER_LOOK)}
    assert len(same) == 1  # the feedback differs, the situation does not
    assert key_text("situation", HALLWAY, INVENTORY) not in same
    assert key_text("situation", KITCHEN, "") not in same  # carrying nothing is another situation


def test_the_paper_key_is_the_state_text_and_is_the_default():
    assert key_text(StateKey.observation, KITCHEN, INVENTORY) == KITCHEN
    assert MemoryServiceConfig().state_key == StateKey.observation
