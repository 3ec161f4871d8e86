"""docs/config-reference.md is what pipeline/config_reference.py writes from the dataclasses: every key of
the configuration with its default, range and meaning; stale (a key added, a default changed) or a key
without a comment fails here."""

from __future__ import annotations

import dataclasses

from pipeline.config import PipelineConfig
from pipeline.config_reference import REFERENCE, field_comments, field_ranges, reference, rows


def _keys(cls: type, prefix: str = "") -> set[str]:
    out = set()
    for f in dataclasses.fields(cls):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out |= _keys(type(value), f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else {prefix + f.name}
    return out


def test_the_committed_reference_is_the_generated_one():
    assert REFERENCE.read_text() == reference(), "run: python -m pipeline.config_reference --write"


def test_every_key_is_in_it_with_a_meaning():
    listed = {key: meaning for _, keys in rows(PipelineConfig) for key, _, _, meaning in keys}
    assert set(listed) == _keys(PipelineConfig) and len(listed) > 200
    assert [key for key, meaning in listed.items() if not meaning] == []


def test_comments_and_ranges_are_read_from_the_source():
    from learner.config import LearnerConfig

    comments, ranges = field_comments(LearnerConfig), field_ranges(LearnerConfig)
    assert comments["lr"] == "peak learning rate (AdamW)"
    assert comments["lora_rank"].startswith("r of LoRA adapters")  # the comment lines above the field
    assert ranges["lr"] == "> 0" and ranges["groups_per_step"] == ">= 1"
    from deploy.config import LaunchConfig

    assert field_ranges(LaunchConfig)["backoff_max_s"] == ">= backoff_s"  # a bound that is another key
