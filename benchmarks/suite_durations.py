"""Where the suite's time goes (issue 39, "measure first"): per test module, its setup (fixtures: a
module-scoped pipeline or server counts in the setup of the module's first test) and call seconds, from
the `--durations=0` lines of a pytest run's output.

    d=$(mktemp -d) && git clone -q . "$d" && (cd "$d" && CI=true PYTEST_ADDOPTS=--durations=0 bash .ci/run) | tee ci.log
    .venv/bin/python -m benchmarks.suite_durations ci.log --out benchmarks/results/suite_durations

writes <out>.json and <out>.md: the modules by total seconds, the share of the suite each takes, and the
slowest single phases (setup or call of one test).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.record import run_header, write_result

DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S+)")
SUMMARY = re.compile(r"=+ (.*?) in (\d+(?:\.\d+)?)s")
SLOWEST = 15


def parse(lines) -> tuple[list[tuple[float, str, str]], str]:
    """([(seconds, phase, test id)], pytest's final summary line)."""
    phases, summary = [], ""
    for line in lines:
        found = DURATION.match(line.strip())
        if found:
            phases.append((float(found[1]), found[2], found[3]))
        elif SUMMARY.search(line) and ("passed" in line or "failed" in line):
            summary = line.strip("= \n")
    return phases, summary


def by_module(phases: list[tuple[float, str, str]]) -> list[dict]:
    """Per test file: setup, call, teardown and total seconds, and its number of tests."""
    modules: dict[str, dict] = defaultdict(lambda: {"setup": 0.0, "call": 0.0, "teardown": 0.0, "tests": set()})
    for seconds, phase, test in phases:
        module = modules[test.split("::", 1)[0]]
        module[phase] += seconds
        module["tests"].add(test)
    rows = [
        {
            "module": name,
            "tests": len(m["tests"]),
            **{k: round(m[k], 1) for k in ("setup", "call", "teardown")},
            "total": round(m["setup"] + m["call"] + m["teardown"], 1),
        }
        for name, m in modules.items()
    ]
    return sorted(rows, key=lambda r: -r["total"])


def table(result: dict) -> str:
    total = sum(r["total"] for r in result["modules"]) or 1.0
    lines = [
        "# Where the suite's time goes",
        "",
        f"{result['date']} · `{result['command']}` · pytest: {result['summary'] or '(no summary line)'}",
        "",
        f"Every phase the run timed adds to {total / 60:.1f} min (setup: fixtures, a module's shared pipeline or "
        "server in its first test's setup).",
        "",
        "| module | tests | setup s | call s | total s | share |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['module']} | {r['tests']} | {r['setup']:.0f} | {r['call']:.0f} | {r['total']:.0f} | {r['total'] / total:.1%} |"
        for r in result["modules"]
        if r["total"] >= 1.0
    ]
    small = [r for r in result["modules"] if r["total"] < 1.0]
    lines += [f"| {len(small)} modules under 1 s each | {sum(r['tests'] for r in small)} | | | "
              f"{sum(r['total'] for r in small):.0f} | |"]  # fmt: skip
    lines += ["", f"The {SLOWEST} slowest phases:", "", "| seconds | phase | test |", "|---|---|---|"]
    lines += [f"| {s:.0f} | {phase} | `{test}` |" for s, phase, test in result["slowest"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="suite_durations", description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="a pytest run's output, with --durations=0")
    parser.add_argument("--out", default="benchmarks/results/suite_durations", help="<out>.json and <out>.md")
    args = parser.parse_args(argv)
    phases, summary = parse(args.log.read_text(errors="replace").splitlines())
    if not phases:
        print(f"suite_durations: no duration lines in {args.log}: was it run with --durations=0?", file=sys.stderr)
        return 2
    result = {
        **run_header(["python", "-m", "benchmarks.suite_durations"], argv if argv is not None else sys.argv[1:]),
        "summary": summary,
        "modules": by_module(phases),
        "slowest": sorted(phases, reverse=True)[:SLOWEST],
    }
    write_result(f"{args.out}.json", result)
    Path(f"{args.out}.md").write_text(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
