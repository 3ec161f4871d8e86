"""The configuration reference (docs/config-reference.md), generated from the dataclasses themselves:
every key of PipelineConfig, its default, its range (the section's validate(): at_least, positive,
within; a choice field's members) and what the field's comment says. One source: a key added to a
dataclass, or a default changed, shows here after `python -m pipeline.config_reference --write`, and
tests/unit/pipeline/test_config_reference.py fails until the file is regenerated.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
from enum import Enum
from functools import cache
from pathlib import Path

from pipeline.config import PipelineConfig

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "config-reference.md"
RANGE_CHECKS = {"at_least": ">= {0}", "positive": "> 0", "within": "{0} .. {1}"}


@cache
def field_comments(cls: type) -> dict[str, str]:
    """{field: its comment}: the comment on the field's line, after the comment lines right above it."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments: dict[int, str] = {}  # line number (1-based) -> comment text
    inline: set[int] = set()  # lines where the comment follows code
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
            if lines[tok.start[0] - 1][: tok.start[1]].strip():
                inline.add(tok.start[0])
    out = {}
    body = ast.parse(source).body[0].body
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, row = [], node.lineno - 1
            while row in comments and row not in inline:
                above.insert(0, comments[row])
                row -= 1
            text = " ".join([*above, comments.get(node.lineno, "") if node.lineno in inline else ""]).strip()
            out[node.target.id] = text
    return out


@cache
def field_ranges(cls: type) -> dict[str, str]:
    """{field: its range}, from the at_least / positive / within calls of the class's validate()."""
    validate = getattr(cls, "validate", None)
    if validate is None:
        return {}
    tree = ast.parse(textwrap.dedent(inspect.getsource(validate)))
    out = {}
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in RANGE_CHECKS):
            continue
        key = call.args[0]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            bounds = [ast.unparse(a).replace("self.", "") for a in call.args[2:]]  # another key: its name
            out[key.value] = RANGE_CHECKS[call.func.id].format(*bounds)
    return out


def default_of(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def shown(value) -> str:
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    if isinstance(value, (list, tuple, dict, frozenset, set)) and len(str(value)) > 60:
        return f"{type(value).__name__} of {len(value)}"
    return f"`{value}`"


def rows(cls: type, prefix: str = "") -> list[tuple[str, list[tuple[str, str, str, str]]]]:
    """[(section, [(key, default, range, meaning)])], the sections in the dataclass's order."""
    comments, ranges = field_comments(cls), field_ranges(cls)
    own, nested = [], []
    for f in dataclasses.fields(cls):
        value = default_of(f)
        if dataclasses.is_dataclass(value):
            nested += rows(type(value), f"{prefix}{f.name}.")
            continue
        choices = type(value) if isinstance(value, Enum) else None
        allowed = " \\| ".join(f"`{m.value}`" for m in choices) if choices else ranges.get(f.name, "")
        meaning = comments.get(f.name, "").replace("|", "\\|")
        own.append((f"{prefix}{f.name}", shown(value), allowed, meaning))
    section = prefix.rstrip(".") or "(top level)"
    return ([(section, own)] if own else []) + nested


def reference() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the dataclasses by `python -m pipeline.config_reference --write` (do not edit): every",
        "key, its default (the dataclass's: the presets and profiles in `conf/` change some, `empo2-config`",
        "prints the composed result), the range its section's `validate()` checks where it is a bound or a",
        "choice (other rules, across keys, are in [configuration.md](configuration.md)), and the field's",
        "comment. Set any key on the command line: `empo2-run learner.lr=3e-5`.",
    ]
    for section, keys in rows(PipelineConfig):
        lines += ["", f"## {section}", "", "| key | default | range | meaning |", "|---|---|---|---|"]
        lines += [f"| `{key}` | {default} | {allowed} | {meaning} |" for key, default, allowed, meaning in keys]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="config_reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {REFERENCE.name} (else print it)")
    args = parser.parse_args(argv)
    text = reference()
    if args.write:
        REFERENCE.write_text(text)
        print(f"wrote {REFERENCE}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
