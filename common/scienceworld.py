"""ScienceWorld behind a small interface: load a (task, variation), step with any text action.

Generated text that is not a valid action is mapped to the most similar valid action (Jaccard
similarity of word sets), as the reference wrapper does, so every step moves the environment.
Each instance owns one JVM (py4j): one per process or thread, always closed.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

# py4j logs at INFO what it expects at a stop (its callback server starting and stopping, and a
# shutdown that finds the JVM already gone, e.g. stopped with its role's process group): with a
# traceback each, in every role's log. Its warnings and errors are still shown.
logging.getLogger("py4j").setLevel(logging.WARNING)

_WORD = re.compile(r"[a-z0-9]+")
_EDGE_NOISE = re.compile(r"^[\s>`\"']+|[\s.`\"']+$")  # prompt arrows, quotes, trailing dots
# The look text: "This room is called the kitchen. In it, you see: \n\tthe agent\n\ta fridge ...\nYou also
# see:\n\tA door to the hallway (that is open)\n"
_ROOM = re.compile(r"This room is called the (.+?)\.")
_LOOK_HEADERS = ("In it, you see:", "You also see:")


def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def clean_action(text: str) -> str:
    """First non-empty line of a generation, without quotes, prompt arrows or trailing dots."""
    for line in text.strip().splitlines():
        line = _EDGE_NOISE.sub("", line)
        if line:
            return line.lower()
    return ""


def most_similar_action(text: str, valid_actions: list[str]) -> tuple[str, bool]:
    """(action to execute, whether it had to be mapped). Ties go to the first valid action."""
    action = clean_action(text)
    if action in valid_actions:
        return action, False
    query = _words(action)
    best, best_score = valid_actions[0], -1.0
    for candidate in valid_actions:
        words = _words(candidate)
        union = len(query | words)
        score = len(query & words) / union if union else 0.0
        if score > best_score:
            best, best_score = candidate, score
    return best, True


def room_of(text: str) -> str:
    """The room named by the last look text in `text` ("This room is called the X."), or ""."""
    rooms = _ROOM.findall(text)
    return rooms[-1] if rooms else ""


def visible_objects(text: str) -> list[str]:
    """The sorted, distinct lines of the last look text in `text` after its room line (objects with
    their state, doors), without the look's headers; [] when `text` holds no look."""
    start = text.rfind("This room is called the ")
    if start < 0:
        return []
    lines = text[start:].split("\n")
    first = lines[0].split(_LOOK_HEADERS[0], 1)[1] if _LOOK_HEADERS[0] in lines[0] else ""
    items = (line.strip() for line in [first, *lines[1:]])
    return sorted({item for item in items if item and item not in _LOOK_HEADERS})


@functools.cache
def task_names() -> tuple[str, ...]:
    """The 30 task names, from the package's task list (no JVM); () if ScienceWorld is not installed."""
    spec = importlib.util.find_spec("scienceworld")
    if spec is None or not spec.submodule_search_locations:
        return ()
    tasks = Path(spec.submodule_search_locations[0]) / "tasks.json"
    return tuple(t["task_name"] for t in json.loads(tasks.read_text()))


@dataclass
class StepResult:
    observation: str
    state: str  # what the agent is shown as the current state: feedback plus the room
    score: float
    done: bool
    valid_actions: list[str]
    location: str = ""  # the room the agent is in (room_of the look text)
    inventory: str = ""  # what the agent carries: ScienceWorld's inventory text (info["inv"])


# ScienceWorld ends an episode after this many steps unless told otherwise (its own default).
DEFAULT_STEP_LIMIT = 100


class ScienceWorld:
    def __init__(self, simplification: str, step_limit: int = DEFAULT_STEP_LIMIT, max_heap_mb: int = 0):
        """simplification: env.simplification; max_heap_mb: env.jvm_max_heap_mb (0: the JVM's default)."""
        from scienceworld import ScienceWorldEnv  # starts a JVM

        if max_heap_mb:  # ScienceWorldEnv takes no JVM options; every JVM reads this variable
            os.environ["JAVA_TOOL_OPTIONS"] = f"-Xmx{max_heap_mb}m"
        self.env = ScienceWorldEnv("", envStepLimit=step_limit)
        self.closed = False
        self.simplification = simplification
        self.task_description = ""

    def train_variations(self, task: str) -> list[int]:
        self.env.load(task, 0, self.simplification)
        return list(self.env.get_variations_train())

    def test_variations(self, task: str) -> list[int]:
        """Variations held out of training: what the test-time adaptation plays."""
        self.env.load(task, 0, self.simplification)
        return list(self.env.get_variations_test())

    def demonstration(self, task: str, variation: int) -> tuple[str, list[str]]:
        """(task description, gold action sequence) of `variation`: ScienceWorld's own expert path.
        Loads that variation: reset() the one to play afterwards."""
        self.env.load(task, variation, self.simplification, generateGoldPath=True)
        actions = list(self.env.get_gold_action_sequence())
        if actions and actions[0].startswith("ERROR"):  # the env could not generate it
            actions = []
        return self.env.get_task_description(), actions

    def gold_length(self, task: str, variation: int) -> int | None:
        """How many actions ScienceWorld's own expert path of (task, variation) takes; None where the
        env cannot generate it. An episode's step limit below this cannot be solved."""
        actions = self.demonstration(task, variation)[1]
        return len(actions) or None

    def action_templates(self) -> list[str]:
        """The action templates of the loaded task ("open OBJ", "move OBJ to OBJ", ...)."""
        return list(self.env.get_possible_actions())

    def reset(self, task: str, variation: int) -> StepResult:
        self.env.load(task, variation, self.simplification)
        obs, info = self.env.reset()
        self.task_description = self.env.get_task_description()
        return StepResult(obs, obs, float(info["score"]), False, list(info["valid"]), *_facts(info))

    def step(self, action: str) -> StepResult:
        obs, _reward, done, info = self.env.step(action)
        state = obs if info["look"] in obs else f"{obs}\n{info['look']}"
        return StepResult(obs, state, float(info["score"]), bool(done), list(info["valid"]), *_facts(info))

    def goal_progress(self) -> str:
        """ScienceWorld's table of the task's subgoals, each done or not, as of the last step."""
        return self.env.get_goal_progress()

    def close(self) -> None:
        """Stop the JVM, once. ScienceWorldEnv.__del__ closes it again, and py4j fails a second
        shutdown (`Gateway is not connected`, then its callback server's `'NoneType' object has no
        attribute 'join'`) with two tracebacks in the role's log: its close is a no-op once done."""
        if self.closed:
            return
        self.closed = True
        try:
            self.env.close()
        finally:
            self.env.close = _already_closed  # what ScienceWorldEnv.__del__ calls


def _already_closed() -> None:
    pass


def _facts(info: dict) -> tuple[str, str]:
    """(location, inventory) of a step's info."""
    return room_of(info["look"]), info["inv"].strip()


@dataclass(frozen=True)
class Subgoal:
    """One line of ScienceWorld's goal progress (ScienceWorldEnv.get_goal_progress()): the task's
    score is built from these. `sequential`: of the ordered subgoals (each needs the ones before),
    else of the unordered and optional ones."""

    sequential: bool
    index: int
    passed: bool
    name: str  # the goal's class in ScienceWorld, e.g. GoalFocusOnLivingThing
    description: str  # e.g. "focus on a living thing"


_SUBGOAL_LINE = re.compile(r"^(\d+)\t(true|false)\t\s*(\S+)\t(.*)$")


def parse_goal_progress(text: str) -> list[Subgoal]:
    """The subgoals of a goal-progress table, in order; [] for "" (not recorded). A line that is not a
    subgoal (the separators, headers, "Completed keys:") is skipped."""
    subgoals, sequential = [], True
    for line in text.splitlines():
        if line.startswith("Sequential Subgoals"):
            sequential = True
        elif line.startswith("Unordered and Optional Subgoals"):
            sequential = False
        elif match := _SUBGOAL_LINE.match(line):
            index, passed, name, description = match.groups()
            subgoals.append(Subgoal(sequential, int(index), passed == "true", name, description.strip()))
    return subgoals
