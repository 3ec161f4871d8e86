"""The architecture as imports: roles meet only through protocol/ (the wire) and common/ (process
helpers and the shared config sections); no role imports pipeline/, which composes the configuration
and hands each role its sections and the run's facts; evaluation/ and deploy/ drive the roles
through their public entry points; common/ imports no role and protocol/ imports nothing of ours;
testing/ (what tests and benchmarks share) is imported by no package of the project."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ROLES = ("actors", "learner", "memory_service", "replay_buffer")
PRODUCT = (*ROLES, "common", "deploy", "evaluation", "pipeline", "protocol", "spa")
OURS = (*PRODUCT, "testing")
ALLOWED = {
    **{role: {role, "protocol", "common"} for role in ROLES},
    "protocol": {"protocol"},
    "common": {"common", "protocol"},
    # the composition root: each role's config section
    "pipeline": {
        "pipeline",
        "common",
        "protocol",
        *(f"{role}.config" for role in ROLES),
        "deploy.config",
        "evaluation.config",
        "spa.config",
    },
    "evaluation": set(PRODUCT),
    "spa": {
        *PRODUCT,
        "evaluation.config",
        "spa.config",
    },  # a driver, like evaluation/: the env actors' client API, the learner's model code
    "deploy": set(PRODUCT),
    # drives every part, as the tests and benchmarks do
    "testing": {*OURS, *(f"{role}.config" for role in ROLES), "deploy.config", "evaluation.config", "spa.config"},
}


def first_party_imports(path: Path) -> set[str]:
    """Our packages a module imports (any depth: late imports inside functions count too), as
    `package` or, for `package.config`, that module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top, _, rest = name.partition(".")
            if top in OURS:
                is_config = rest.split(".")[-1] == "config" and top in ROLES + (
                    "deploy",
                    "evaluation",
                    "spa",
                )  # actors.env_actor.config too
                found.add(f"{top}.config" if is_config else top)
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_the_architecture_allows(package):
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    offending = {}
    for path in files:
        bad = {
            name for name in first_party_imports(path) if name.split(".")[0] != package and name not in ALLOWED[package]
        }
        if bad:
            offending[str(path.relative_to(REPO))] = sorted(bad)
    assert not offending, f"imports across the architecture's boundaries: {offending}"


def test_the_check_sees_a_forbidden_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from actors.env_actor import EnvActor\n    import learner.config\n")
    assert first_party_imports(module) == {"actors", "learner.config"}


def imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports, ours or not (any depth, as first_party_imports)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


# tests/ and benchmarks/ use the project, never each other: what both need (fuzzing, the lockstep
# audit, a run harness, synthetic messages) lives in testing/; only the tests of benchmark code import
# benchmarks/
@pytest.mark.parametrize(("importer", "forbidden"), [("benchmarks", "tests"), ("tests", "benchmarks")])
def test_tests_and_benchmarks_do_not_import_each_other(importer, forbidden):
    benchmark_tests = REPO / "tests" / "unit" / "benchmarks"
    offending = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / importer).rglob("*.py"))
        if benchmark_tests not in path.parents and forbidden in imported_packages(path)
    ]
    assert not offending, f"{importer}/ modules that import {forbidden}/: {offending}"


def test_the_check_sees_a_late_import_of_the_tests(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import numpy as np\n\ndef f():\n    from tests.factories import Turn\n")
    assert imported_packages(module) == {"numpy", "tests"}
