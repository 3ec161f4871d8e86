"""A stand-in role process for the launcher's unit tests (tests/unit/deploy/test_supervisor.py):
`python -m tests.unit.deploy.role_stub [overrides ...] BEHAVIOUR`, BEHAVIOUR one of
  exit:N          exit with status N at once
  flaky:PATH:N    the first run (PATH absent) creates PATH and exits with N; later runs sleep
  sleep           sleep until signalled
  done-after:PATH the first run creates PATH and sleeps; a later run exits 0 (a learner that finishes
                  after a restart)
  serve:PORT      serve an env actor's metrics (common.metrics.EnvActorMetrics) on PORT, counting
                  env steps, until signalled
  token:PATH      write the learner token the launcher handed it (EMPO2_LEARNER_TOKEN) to PATH, sleep
  beat:PATH[:S]   heart-beat to PATH (common/heartbeat.py) every 0.1 s, for S seconds if given, then
                  sleep without a beat (a role that hangs)
Only the last argument counts: the launcher puts its config overrides first."""

import sys
import time
from pathlib import Path

behaviour = sys.argv[-1]
print(f"role stub {behaviour}", flush=True)
kind, *rest = behaviour.split(":")
if kind == "exit":
    sys.exit(int(rest[0]))
if kind == "flaky" and not Path(rest[0]).exists():
    Path(rest[0]).touch()
    sys.exit(int(rest[1]))
if kind == "serve":
    from common.metrics import EnvActorMetrics

    metrics = EnvActorMetrics()
    metrics.serve("127.0.0.1", int(rest[0]))
    while True:
        metrics.env_steps.inc()
        time.sleep(0.1)
if kind == "beat":
    from common.heartbeat import HEARTBEAT, beat

    HEARTBEAT.start(rest[0])
    until = time.monotonic() + (float(rest[1]) if len(rest) > 1 else float("inf"))
    while time.monotonic() < until:
        beat()
        time.sleep(0.1)
if kind == "token":
    import os

    Path(rest[0]).write_text(os.environ.get("EMPO2_LEARNER_TOKEN", ""))
if kind == "done-after":
    if Path(rest[0]).exists():
        sys.exit(0)
    Path(rest[0]).touch()
time.sleep(3600)
