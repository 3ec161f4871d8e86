"""The periodic evaluation during training (eval.every_steps > 0): a role of its own, started by
the launcher beside the learner, which never waits on it.

Every eval.checkpoint_poll_s it looks at <run_dir>/checkpoints; when the newest complete checkpoint is from
a step that is a multiple of eval.every_steps and has not been scored yet, it scores that one
(older unscored ones are skipped: the newest is what matters) with the same evaluation as
empo2-eval, on eval.subset_tasks (default eval.tasks) x eval.subset_variations test variations:
`empo2-eval` (`python -m pipeline empo2-eval`) as a child process, with its own policy server serving the
checkpoint on eval.server_endpoint and its own metrics block (eval.metrics_base_port), so no
socket or port of the training is shared. The results are in <run_dir>/eval/step_N/ and, as an
"eval" record, in <run_dir>/metrics.jsonl beside the learner's steps (empo2-plot draws them).
A failed evaluation is logged and counted, and the next checkpoint is tried.

Run: started by `empo2-run eval.every_steps=N learner.checkpoint_every=M` (N a multiple of M);
alone: `python -m pipeline empo2-evaluator [key=value ...]`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from common.logs import setup_logging
from common.metrics import EvaluatorMetrics
from common.process import interrupt_on_sigterm, spawn_command, stop_group
from evaluation.eval import PolicyChoice, policy_step
from pipeline.config import PipelineConfig

log = logging.getLogger("evaluator")
STOP_GRACE_S = 30.0  # the child evaluation stops its policy server on SIGTERM; then it is killed


def due_checkpoint(cfg: PipelineConfig, scored: set[str]) -> Path | None:
    """The newest complete checkpoint, if its step is due (a multiple of eval.every_steps) and unscored."""
    from learner.checkpoint import list_checkpoints

    found = list_checkpoints(Path(cfg.run_dir) / "checkpoints")
    if not found:
        return None
    newest = found[-1]
    step = policy_step(PolicyChoice(newest.name, str(newest)))
    if step == 0 or step % cfg.eval.every_steps or newest.name in scored:
        return None
    return newest


def eval_overrides(cfg: PipelineConfig, overrides: list[str], checkpoint: Path) -> list[str]:
    """The child evaluation's configuration: the training's, with the subset, the checkpoint and
    the evaluation's own server endpoint and metrics block."""
    tasks = cfg.eval.subset_tasks or cfg.eval.tasks or cfg.replay_buffer.tasks
    return [
        *overrides,
        f"run_dir={cfg.run_dir}",
        f"eval.policy={checkpoint.resolve()}",
        f"eval.tasks=[{','.join(tasks)}]",
        f"eval.variations={cfg.eval.subset_variations}",
        "eval.reuse_servers=false",
        "eval.every_steps=0",  # the child is an evaluation, not another periodic evaluator
        f"endpoints.policy_servers=[{cfg.eval.server_endpoint}]",
        f"metrics.base_port={cfg.eval.metrics_base_port}",
    ]


def score(cfg: PipelineConfig, overrides: list[str], checkpoint: Path, metrics: EvaluatorMetrics) -> bool:
    log_path = cfg.run_path("logs", f"eval_{checkpoint.name}.log")
    log.info("scoring %s (log %s)", checkpoint, log_path)
    child = spawn_command("empo2-eval", eval_overrides(cfg, overrides, checkpoint), log_path)
    try:
        rc = child.wait()
    finally:
        stop_group(child, grace_s=STOP_GRACE_S)
    results = Path(cfg.run_dir) / "eval" / checkpoint.name / "results.json"
    ok = rc == 0 and results.exists() and json.loads(results.read_text()).get("complete", False)
    metrics.evaluations.labels("ok" if ok else "failed").inc()
    if ok:
        step = policy_step(PolicyChoice(checkpoint.name, str(checkpoint)))
        metrics.last_step.set(step)
        metrics.policy_version.set(step)
        log.info("scored %s: %s", checkpoint.name, json.loads(results.read_text()).get("mean_score"))
    else:
        log.warning("evaluation of %s failed (exit %s); see %s", checkpoint.name, rc, log_path)
    return ok


def main(argv: list[str], cfg: PipelineConfig) -> int:
    setup_logging("evaluator")
    interrupt_on_sigterm()  # the launcher's stop reaches the child evaluation through the finally below
    if not cfg.eval.every_steps:
        log.error("eval.every_steps is 0: nothing to do")
        return 2
    metrics = EvaluatorMetrics()
    metrics.serve(cfg.metrics.host, cfg.metrics.port("evaluator"))
    scored: set[str] = set()  # tried, whatever the outcome: a failing checkpoint is not retried forever
    failures = 0
    try:
        while True:
            checkpoint = due_checkpoint(cfg, scored)
            if checkpoint is None:
                time.sleep(cfg.eval.checkpoint_poll_s)
                continue
            scored.add(checkpoint.name)
            failures += 0 if score(cfg, argv, checkpoint, metrics) else 1
    except KeyboardInterrupt:
        log.info("stopped; %d checkpoints tried, %d failed", len(scored), failures)
        return 0


if __name__ == "__main__":
    sys.exit(main())
