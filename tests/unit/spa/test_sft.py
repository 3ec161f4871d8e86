"""SPA's SFT (spa/sft.py) on a tiny Llama with the embedded model's tokenizer: it lowers the held-out
loss of collected episodes, its checkpoint loads in the learner, a rerun with more epochs resumes after
the last one saved, and the split is by episode and seeded."""

from __future__ import annotations

import json

import pytest

from common.model_prep import resolve_model
from learner.policy_model import load_policy
from pipeline.config import load_config
from spa.collect import EPISODES_FILE
from spa.sft import REPORT, sft, split


def record(seed: int) -> dict:
    k = seed % 3
    return {
        "seed": seed,
        "task": "find-living-thing",
        "variation": k,
        "score": 0.0,
        "task_description": "Find a living thing.",
        "demonstration": None,
        "action_templates": ["open OBJ", "go to OBJ"],
        "turns": [
            {
                "state": f"You are in the kitchen {t}.",
                "note": "",
                "response": f"<think><observation>x</observation> go. <prediction>y</prediction></think><answer>open door {t}",
                "action": f"open door {t}",
                "current": f"Location: kitchen. Inventory: item {t}.",
                "next": f"The door is open. Location: hallway. Inventory: item {t}.",
            }
            for t in range(3)
        ],
    }


@pytest.fixture
def model_dir(tmp_path):
    from transformers import AutoTokenizer

    from testing.factories import tiny_llama

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("embedded:SmolLM2-135M-Instruct"))
    model = tiny_llama(len(tokenizer), seed=1, max_position_embeddings=2048, tie_word_embeddings=True)
    path = tmp_path / "tiny"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_sft_lowers_the_held_out_loss_saves_a_loadable_checkpoint_and_resumes(tmp_path, model_dir):
    run = tmp_path / "run"
    (run / "spa").mkdir(parents=True)
    (run / "spa" / EPISODES_FILE).write_text("".join(json.dumps(record(s)) + "\n" for s in range(10)))
    overrides = [f"run_dir={run}", f"model.name={model_dir}", "spa.lr=2e-2", "spa.batch_rows=6", "spa.device=cpu"]
    first = sft(load_config([*overrides, "spa.epochs=2"]))
    report = json.loads((run / "spa" / REPORT).read_text())
    assert [e["epoch"] for e in report["epochs"]] == [1, 2] and first.name == "step_000002"
    assert report["epochs"][-1]["held_out"]["loss"] < report["before"]["loss"] - 2.0  # nats per token
    assert report["before"]["predictions"] == 2 * 3  # 2 held-out episodes (20% of 10), 3 turns each
    # its HF directory (step_N/model), as model.name=<it> resolves for the learner (and vLLM)
    model, _ = load_policy(resolve_model(str(first)), "cpu")
    assert model.config.vocab_size > 40000
    again = sft(load_config([*overrides, "spa.epochs=3"]))  # resumes after epoch 2
    report = json.loads((run / "spa" / REPORT).read_text())
    assert [e["epoch"] for e in report["epochs"]] == [1, 2, 3] and again.name == "step_000003"
    assert not (run / "spa" / "sft" / "step_000002").exists()  # only the last is kept


def test_the_split_is_by_episode_seeded_and_holds_out_at_least_one():
    train, held = split(list(range(10)), 0.2, 42)
    assert len(held) == 2 and sorted(train + held) == list(range(10))
    assert split(list(range(10)), 0.2, 42) == (train, held) and split(list(range(10)), 0.2, 7) != (train, held)
    assert split([1, 2], 0.2, 0)[1] != [] and split([1], 0.2, 0) == ([1], [])


def test_the_next_state_accuracy_counts_predictions_right_token_for_token(monkeypatch):
    import numpy as np
    import torch

    import spa.sft
    from spa.states import Sequence

    tokens = np.array([1, 2, 3, 4, 5, 6, 7], np.int32)
    seq = Sequence(tokens, [(1, 6)], [(2, 2), (5, 2)], rows=1)  # predictions: tokens 3 4 and 6 7

    def scored(model, s, extra=()):
        at = torch.full((4, 10), -5.0)
        for row, token in enumerate([3, 4, 6, 9]):  # the second prediction's last token is wrong
            at[row, token] = 0.0
        return torch.full((6,), -0.5), at

    monkeypatch.setattr(spa.sft, "_scored", scored)
    model = torch.nn.Linear(1, 1)
    out = spa.sft.held_out(model, [seq])
    assert out["next_state_accuracy"] == 0.5 and out["predictions"] == 2 and out["loss"] == 0.5


def test_without_a_well_formed_turn_drop_stops_saying_so_and_rebuild_trains(tmp_path, model_dir):
    run = tmp_path / "run"
    (run / "spa").mkdir(parents=True)
    records = [record(s) for s in range(4)]
    for r in records:
        for t in r["turns"]:
            t["response"] = "This room is called the kitchen. open door"  # no tags: what the 135M model writes
    (run / "spa" / EPISODES_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    overrides = [f"run_dir={run}", f"model.name={model_dir}", "spa.epochs=1", "spa.device=cpu"]
    with pytest.raises(SystemExit, match="none of the 12 collected turns is well-formed"):
        sft(load_config([*overrides, "spa.malformed=drop"]))
    sft(load_config([*overrides, "spa.malformed=rebuild"]))
    report = json.loads((run / "spa" / REPORT).read_text())
    assert report["before"]["predictions"] == 3  # 1 held-out episode of 4, its 3 turns rebuilt and trained
