"""The run summary's word on the tips it showed (deploy/launch.py, tips_note): when none, why."""

from __future__ import annotations

from deploy.launch import tips_note
from protocol.messages import OFF_POLICY, ON_POLICY


def _final(**kw) -> dict:
    return {"tips_shown": 0, "tip_turns": 0, "memory_fallbacks": 0, "memory_entries": 0, **kw}


def _steps(*modes: dict) -> list[dict]:
    return [{"episodes": sum(m.values()), "episodes_by_mode": m} for m in modes]


def test_tips_shown_are_counted_with_the_episodes_drawn_in_a_tip_mode():
    note = tips_note(_final(tips_shown=12, tip_turns=5), _steps({ON_POLICY: 4}, {OFF_POLICY: 4}), 0.25)
    assert note == "5 turns showed tips, in 4 of 8 trained episodes drawn in a tip mode"


def test_no_tips_says_why_the_first_reason_that_holds():
    assert "p_memory is 0" in tips_note(_final(), _steps({ON_POLICY: 4}), 0.0)
    # make run's default: two groups, both drawn on-policy
    assert tips_note(_final(memory_entries=20), _steps({ON_POLICY: 4}, {ON_POLICY: 4}), 0.25) == (
        "none: no group was drawn in a tip mode (replay_buffer.p_memory=0.25; 8 trained episodes, all on-policy)"
    )
    tipped = _steps({OFF_POLICY: 4})
    assert "did not answer (3 turns" in tips_note(_final(memory_fallbacks=3), tipped, 0.25)
    assert "memory was empty" in tips_note(_final(), tipped, 0.25)
    assert "close enough" in tips_note(_final(memory_entries=40), tipped, 0.25)
