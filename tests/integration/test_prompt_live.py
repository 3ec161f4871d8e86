"""The action prompt on a live ScienceWorld (a real JVM) with the real tokenizer: the task, the
demonstration from another *training* variation's gold path (never a test variation), the env's
action templates, and the episode as a token chain whose user turns keep their tips, with tip spans
that cover exactly the tip text, whose responses are the generated tokens with one end of turn each,
and whose next user turn names the executed action where the env mapped the response. The policy is a
fixed text (the real policy's path is the e2e test's)."""

from __future__ import annotations

import numpy as np
import pytest

from actors.env_actor.episode import open_episode_runner
from actors.env_actor.prompts import format_tip_block
from learner.samples import remove_spans
from pipeline.cli import given
from pipeline.config import load_config
from protocol.messages import OFF_POLICY, Assignment, GenerateResponse

pytestmark = pytest.mark.integration

TASK = "find-living-thing"


@pytest.fixture(scope="module")
def runner():
    runner = open_episode_runner(**given("empo2-env-actor", load_config(["env.max_steps=3"])))
    yield runner
    runner.env.close()


# the responses of the turns as vLLM returns them: the tokens (the end-of-sequence token, or the newline
# the stop string cut, kept in them) and the text (without the newline)
RESPONSES = [("open door to hallway", "<|im_end|>"), ("go to the hallway please", "\n"), ("look around", "\n")]


def _policy(tokenizer):
    turns = iter(RESPONSES)

    def generate(prompt_ids: np.ndarray, seed: int) -> GenerateResponse:
        text, end = next(turns)
        ids = tokenizer(text + end, add_special_tokens=False)["input_ids"]
        return GenerateResponse(
            request_id="r",
            token_ids=np.array(ids, np.int32),
            logprobs=np.full(len(ids), -0.1, np.float32),
            text=text,
            policy_version=0,
            finish_reason="stop",
        )

    return generate


def test_the_demonstration_is_another_training_variations_gold_path(runner):
    env = runner.env
    train, test = env.train_variations(TASK), env.test_variations(TASK)
    assert not set(train) & set(test)
    demo, templates = runner.prompt_parts(TASK, train[0])
    assert demo.variation == train[1]  # not the variation played
    assert len(demo.actions) > 3
    # it is that variation's gold path (ScienceWorld draws one at each load: cached per task): replayed
    # on that variation, it solves the task
    result = env.reset(TASK, train[1])
    assert demo.task_description == env.task_description
    for action in demo.actions:
        result = env.step(action)
    assert result.done and result.score == 100
    assert "focus on OBJ" in templates and "move OBJ to OBJ" in templates
    for played in (train[1], test[0], test[-1]):  # a test episode too gets a training variation's path
        demo, _ = runner.prompt_parts(TASK, played)
        assert demo.variation in train and demo.variation not in test and demo.variation != played


def test_golden_prompt_of_a_live_episode_with_tips_on_some_turns(runner):
    tokenizer = runner.prompts.tokenizer
    shown = {0: ["Doors must be opened first."], 2: ["Living things are often outside.", "Focus, then move."]}
    calls = iter(range(10))

    def retrieve(task, variation, state, inventory=""):
        tips = shown.get(next(calls), [])
        return tips, len(tips)

    a = Assignment(group_id="g", slot=0, task=TASK, variation=0, mode=OFF_POLICY, seed=1)
    trajectory, stats = runner.play(a, "actor-test", _policy(tokenizer), retrieve)
    trajectory.validate()
    assert trajectory.num_turns == 3 and stats.prompt_tokens == [len(trajectory.turn_prompt(i)) for i in range(3)]
    # one chain: each prompt starts with the previous prompt and response, token for token
    assert trajectory.chain_starts.tolist() == [1, 0, 0]
    for i in (1, 2):
        head = np.concatenate([trajectory.turn_prompt(i - 1), trajectory.turn_response(i - 1)])
        np.testing.assert_array_equal(trajectory.turn_prompt(i)[: len(head)], head)

    last = trajectory.turn_prompt(2)
    text = tokenizer.decode(last.tolist())
    demo, templates = runner.prompt_parts(TASK, 0)
    description = runner.env.task_description
    # the system part: the task, the other variation's gold path, the env's templates
    system = text.split("<|im_end|>")[0]
    assert f"Task: {description}" in system
    assert "\n".join(f"> {x}" for x in demo.actions) in system
    assert "\n".join(templates) in system
    # the chat: a user turn per state (with the tips shown then), an assistant turn per action
    user_turns = text.split("<|im_start|>user\n")[1:]
    assert len(user_turns) == 3
    assert [t.split("<|im_end|>")[0].endswith(format_tip_block(shown[0])) for t in user_turns] == [True, False, False]
    assert user_turns[2].split("<|im_end|>")[0].endswith(format_tip_block(shown[2]))
    # what the model wrote, as it ended (one <|im_end|> whether it stopped there or at a newline)
    assert "<|im_start|>assistant\nopen door to hallway<|im_end|>\n<|im_start|>user\n" in text
    assert "<|im_start|>assistant\ngo to the hallway please\n<|im_end|>\n<|im_start|>user\n" in text
    assert "<|im_end|><|im_end|>" not in text
    # the next user turn names the action executed where the env mapped the response to another one
    for i in (0, 1):
        note = f"(Not a valid action; executed instead: {trajectory.actions[i]})\n"
        mapped = trajectory.actions[i] != RESPONSES[i][0]
        assert user_turns[i + 1].startswith(note) == mapped
    assert trajectory.actions[1] != RESPONSES[1][0]  # "please" is no valid action: mapped, and named
    assert user_turns[0].startswith(trajectory.observations[0].strip())
    # the spans: two in the last turn's prompt (turn 0's kept, its own), exactly the tip text
    spans = trajectory.turn_tip_spans(2)
    assert [tokenizer.decode(last[s:e].tolist()) for s, e in spans] == [
        format_tip_block(shown[0]),
        format_tip_block(shown[2]),
    ]
    assert [tokenizer.decode(trajectory.turn_prompt(1)[s:e].tolist()) for s, e in trajectory.turn_tip_spans(1)] == [
        format_tip_block(shown[0])
    ]
    # the learner's tip-free prompt is the prompt built without any tip
    tipfree = tokenizer.decode(remove_spans(last, spans).tolist())
    assert "<tip>" not in tipfree and tipfree == text.replace(format_tip_block(shown[0]), "").replace(
        format_tip_block(shown[2]), ""
    )
