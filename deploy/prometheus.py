"""Prometheus on a run's own targets: `make monitor [RUN_DIR=runs/<run>]` (default: the newest run).

Writes <run_dir>/prometheus/prometheus.yml, a scrape config whose targets come from the
launcher's file-based discovery (<run_dir>/prometheus/targets.json, deploy/run_state.py: every
role the launcher runs, and the launcher itself; a restarted or added process shows up without
editing a file) and that loads deploy/monitoring/rules.yml; then runs Debian's `prometheus`
(scripts/setup.sh installs it) with its data in <run_dir>/prometheus/data and prints the URLs.

    python -m deploy.prometheus [RUN_DIR] [--listen 127.0.0.1:9090] [--scrape-interval 5s]

For hosts run by systemd (no launcher) deploy/monitoring/prometheus.yml lists the default ports.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from deploy.run_state import TARGETS_FILE, newest_run

RULES = Path(__file__).resolve().parent / "monitoring" / "rules.yml"


def prometheus_config(run_dir: Path, scrape_interval: str, rule_files: list[Path]) -> dict:
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": "empo2",  # each target's own `job` label (empo2_<role>) replaces this
                "file_sd_configs": [{"files": [str((run_dir / TARGETS_FILE).resolve())], "refresh_interval": "1s"}],
            }
        ],
    }


def start_prometheus(
    run_dir: Path, listen: str, scrape_interval: str, rule_files: list[Path], log_path: Path
) -> subprocess.Popen:
    """Write the run's config and start Prometheus on it (in a session of its own, like a role)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError("prometheus is not installed: run scripts/setup.sh (apt-get install prometheus)")
    home = run_dir / "prometheus"
    home.mkdir(parents=True, exist_ok=True)
    config = home / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(run_dir, scrape_interval, rule_files), sort_keys=False))
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address={listen}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(listen: str, timeout_s: float, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{listen}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"prometheus on {listen} not ready (exit status {process.poll()})")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.prometheus", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, nargs="?", help="default: the newest run under runs/")
    parser.add_argument("--listen", default="127.0.0.1:9090", help="Prometheus web address (loopback by default)")
    parser.add_argument("--scrape-interval", default="5s")
    args = parser.parse_args(argv)
    args.run_dir = args.run_dir or newest_run()
    if args.run_dir is None or not (args.run_dir / TARGETS_FILE).exists():
        print(f"no launcher targets in {args.run_dir or 'runs/'}: start the run (make run) first", file=sys.stderr)
        return 2
    log_path = args.run_dir / "prometheus" / "prometheus.log"
    process = start_prometheus(args.run_dir, args.listen, args.scrape_interval, [RULES], log_path)
    try:
        wait_ready(args.listen, 60, process)
        print(
            f"Prometheus: http://{args.listen}  (targets http://{args.listen}/targets, alerts "
            f"http://{args.listen}/alerts, rules http://{args.listen}/rules); log {log_path}; Ctrl-C stops it",
            flush=True,
        )
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
