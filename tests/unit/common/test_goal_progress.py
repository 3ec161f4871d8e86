"""ScienceWorld's goal progress parsed into subgoals (HeRL's rubrics): on the table a real
find-living-thing episode ended with (recorded from a run of the learning check)."""

from __future__ import annotations

from common.scienceworld import Subgoal, parse_goal_progress

RECORDED = (
    "Completed keys: \n"
    + "-" * 100
    + "\nSequential Subgoals:\n"
    + "-" * 100
    + "\n0\tfalse\t                  GoalFocusOnLivingThing\tfocus on a living thing\n"
    "1\tfalse\t                   GoalObjectInContainer\tmove living thing to answer box\n"
    + "-" * 100
    + "\nUnordered and Optional Subgoals:\n"
    + "-" * 100
    + "\n0\tfalse\t                   GoalObjectInContainer\tPick up object\n"
    "1\ttrue\t                  GoalInRoomWithOpenDoor\tBe in a room with an open door\n"
    "2\tfalse\t                   GoalMoveToNewLocation\tMove to a new location\n"
    "3\tfalse\t                      GoalMoveToLocation\tMove to the location of the answer box\n" + "-" * 100 + "\n"
)


def test_every_subgoal_line_with_its_flag_and_kind():
    subgoals = parse_goal_progress(RECORDED)
    assert subgoals[0] == Subgoal(True, 0, False, "GoalFocusOnLivingThing", "focus on a living thing")
    assert [(s.sequential, s.index) for s in subgoals] == [
        (True, 0),
        (True, 1),
        (False, 0),
        (False, 1),
        (False, 2),
        (False, 3),
    ]
    assert [s.description for s in subgoals if s.passed] == ["Be in a room with an open door"]
    assert parse_goal_progress("") == []
