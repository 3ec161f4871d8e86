"""ScienceWorld's look text read by common/scienceworld.py (room_of, visible_objects), on texts as
ScienceWorld 1.x writes them (find-living-thing, variation 0, at reset). No JVM."""

from __future__ import annotations

from common.scienceworld import room_of, visible_objects

LOOK = (
    "This room is called the hallway. In it, you see: \n\tthe agent\n\ta substance called air\n\ta picture\n"
    "You also see:\n\tA door to the art studio (that is open)\n\tA door to the kitchen (that is open)\n"
)


def test_the_room_and_objects_of_a_look():
    assert room_of(LOOK) == "hallway"
    assert visible_objects(LOOK) == [
        "A door to the art studio (that is open)",
        "A door to the kitchen (that is open)",
        "a picture",
        "a substance called air",
        "the agent",
    ]


def test_the_last_look_of_a_state_counts():
    """The env actor's state is the feedback, then the look (twice after "look around")."""
    kitchen = LOOK.replace("hallway", "kitchen").replace("a picture", "a fridge")
    state = f"You move to the kitchen.\n{LOOK}\n{kitchen}"
    assert room_of(state) == "kitchen"
    assert "a fridge" in visible_objects(state) and "a picture" not in visible_objects(state)


def test_a_text_without_a_look():
    assert room_of("The door is now open.") == "" and visible_objects("The door is now open.") == []
    one_line = "This room is called the kitchen. In it, you see: a counter, an apple."
    assert room_of(one_line) == "kitchen" and visible_objects(one_line) == ["a counter, an apple."]
