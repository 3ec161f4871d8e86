"""Test-time adaptation (paper Figure 8): K trials per unseen task, memory on, weights frozen.

Starts only the policy server(s) and the memory service as processes (deploy.launch.Launcher,
logs in <run_dir>/logs; no buffer, env actors or learner, so the weights never change), then
plays the trials in this process with the env actor's episode logic, in mode on_policy_tips at
tta.temperature, on the first tta.variations test variations of each of tta.tasks. After each
trial the episode goes to the memory service, and the next trial starts once its reflection is
stored (at most tta.reflection_wait_s later), so every trial sees the memories of the previous
ones. Prints a line per trial and a table of scores (trial 1..K, mean per trial), also written
to <run_dir>/tta.json. The started processes are always stopped.

Sockets (DEALER clients, through the env actor's client API, actors.env_actor.EnvWorker):
  policy servers: Ping -> Pong ; GenerateRequest -> GenerateResponse
  memory service: Ping -> Pong ; MemoryQuery -> MemoryResult ; EpisodeReport -> Ack
Reads the memory service's Prometheus endpoint to see a reflection stored.

Run: `empo2-memory-tta [key=value ...]`, e.g. `empo2-memory-tta tta.trials=5 'tta.tasks=[find-animal]'`.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field

from actors.env_actor.worker import EnvWorker
from common.logs import setup_logging
from common.metrics import MEMORY_SERVICE_ENTRIES, MEMORY_SERVICE_ERRORS, MEMORY_SERVICE_REFLECTIONS
from common.model_prep import prepare_model
from common.process import exit_on_sigterm
from deploy.launch import Launcher
from deploy.monitor import scrape, total
from evaluation.config import FIXED_WEIGHTS
from pipeline.config import PipelineConfig, run_facts
from pipeline.roles import RoleSpec, run_roles
from protocol.messages import ON_POLICY_TIPS, Assignment

log = logging.getLogger("tta")

TTA_ROLES = ("policy_server", "memory_service")  # prefixes of deploy.launch.run_roles names
REFLECTION_ERRORS = f'{MEMORY_SERVICE_ERRORS}{{where="reflection"}}'
REFLECTION_POLL_S = 0.5  # how often the memory service's metrics are read while a reflection is awaited


@dataclass
class TaskResult:
    """One (task, variation): per trial, its score, the tips shown and whether its reflection was stored."""

    task: str
    variation: int
    scores: list[float] = field(default_factory=list)
    tips_shown: list[int] = field(default_factory=list)
    reflection_stored: list[bool] = field(default_factory=list)


def tta_roles(cfg: PipelineConfig) -> list[RoleSpec]:
    return [r for r in run_roles(cfg) if r.name.startswith(TTA_ROLES)]


def wait_for_servers(worker: EnvWorker, launcher: Launcher) -> None:
    """The policy servers and the memory service ready; a started process that died ends the run
    with its log's last lines instead of a long wait."""
    endpoints = [*worker.run_facts.endpoints.policy_servers, worker.run_facts.endpoints.memory_service]
    print(f"[tta] waiting for {', '.join(endpoints)}", flush=True)
    worker.wait_ready(buffer=False, memory=True, on_wait=lambda _endpoint, _left: launcher.check_alive())


def reflection_counts(cfg: PipelineConfig) -> tuple[float, float]:
    """(reflections stored, reflections failed) so far, from the memory service's metrics."""
    samples = scrape(cfg.metrics.host, cfg.metrics.port("memory_service"))
    return total(samples, MEMORY_SERVICE_REFLECTIONS), samples.get(REFLECTION_ERRORS, 0.0)


def wait_for_reflection(cfg: PipelineConfig, launcher: Launcher, before: tuple[float, float]) -> bool:
    """True once the memory service stored one more reflection than `before`; False if it failed
    or tta.reflection_wait_s passed (the next trial then plays without that trial's memories)."""
    deadline = time.monotonic() + cfg.tta.reflection_wait_s
    while time.monotonic() < deadline:
        launcher.check_alive()
        stored, failed = reflection_counts(cfg)
        if stored > before[0]:
            return True
        if failed > before[1]:
            log.warning("the reflection failed (see memory_service.log); the next trial goes without it")
            return False
        time.sleep(REFLECTION_POLL_S)
    log.warning("no reflection stored within %.0fs; the next trial goes without it", cfg.tta.reflection_wait_s)
    return False


def play_trial(cfg: PipelineConfig, launcher: Launcher, worker: EnvWorker, result: TaskResult) -> None:
    trial = len(result.scores)
    # the training assignment's seed policy: one group per (task, variation), one slot per trial
    assignment = Assignment(
        group_id=f"tta-{result.task}-{result.variation}",
        slot=trial,
        task=result.task,
        variation=result.variation,
        mode=ON_POLICY_TIPS,
        seed=trial,
    )
    t0 = time.monotonic()
    episode = worker.play(assignment, temperature=cfg.tta.temperature)
    trajectory, stats = episode.trajectory, episode.stats
    before = reflection_counts(cfg)
    worker.report_episode(episode)
    # also after the last trial: the store is complete when the memory service is stopped
    stored = wait_for_reflection(cfg, launcher, before)
    result.scores.append(trajectory.score)
    result.tips_shown.append(stats.tips_shown)
    result.reflection_stored.append(stored)
    print(
        f"[tta] {result.task} variation {result.variation} trial {trial + 1}/{cfg.tta.trials}: "
        f"score {trajectory.score:.0f}, {trajectory.num_turns} steps, {stats.tips_shown} tips shown, "
        f"reflection {'stored' if stored else 'missing'} ({time.monotonic() - t0:.0f}s)",
        flush=True,
    )


def mean_per_trial(results: list[TaskResult]) -> list[float]:
    trials = max((len(r.scores) for r in results), default=0)
    return [statistics.fmean(r.scores[k] for r in results if len(r.scores) > k) for k in range(trials)]


def write_results(cfg: PipelineConfig, results: list[TaskResult]) -> None:
    report = {
        "model": cfg.model.name,
        "tasks": cfg.tta.tasks,
        "trials": cfg.tta.trials,
        "temperature": cfg.tta.temperature,
        "memory_key": cfg.memory_service.key,
        "results": [asdict(r) for r in results],
        "mean_per_trial": mean_per_trial(results),
    }
    cfg.run_path("tta.json").write_text(json.dumps(report, indent=1))


def play_all(cfg: PipelineConfig, launcher: Launcher, worker: EnvWorker) -> list[TaskResult]:
    results: list[TaskResult] = []
    for task in cfg.tta.tasks:
        for variation in worker.env.test_variations(task)[: cfg.tta.variations]:
            results.append(TaskResult(task, variation))
            for _ in range(cfg.tta.trials):
                launcher.check_alive()
                play_trial(cfg, launcher, worker, results[-1])
                write_results(cfg, results)  # after every trial, so an interrupted run keeps what it played
    return results


def format_table(results: list[TaskResult]) -> str:
    means = mean_per_trial(results)
    header = ["task", "variation", *[f"trial {k + 1}" for k in range(len(means))]]
    rows = [[r.task, str(r.variation), *[f"{s:.0f}" for s in r.scores]] for r in results]
    rows.append(["mean", "", *[f"{m:.1f}" for m in means]])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows])


def run(cfg: PipelineConfig, overrides: list[str]) -> list[TaskResult]:
    launcher = Launcher(cfg, [*overrides, *FIXED_WEIGHTS], roles=tta_roles(cfg))
    with ExitStack() as cleanup:
        cleanup.callback(launcher.stop)  # registered first, so it runs last and also after a partial start
        launcher.start()
        # the env actor's episodes, requests, retrieval and reports (sampling at tta.temperature)
        worker = EnvWorker(cfg.env_actor, cfg.env, run_facts(cfg), sge=cfg.sge)
        cleanup.callback(worker.close)
        worker.open()  # the tokenizer and the JVM load while the servers start
        wait_for_servers(worker, launcher)
        entries = total(scrape(cfg.metrics.host, cfg.metrics.port("memory_service")), MEMORY_SERVICE_ENTRIES)
        print(
            f"[tta] ready; memory holds {entries:.0f} entries; {cfg.tta.trials} trials per task at temperature "
            f"{cfg.tta.temperature}",
            flush=True,
        )
        return play_all(cfg, launcher, worker)


def main(argv: list[str], cfg: PipelineConfig) -> int:
    setup_logging("tta")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # closing ScienceWorld logs harmless tracebacks at INFO
    exit_on_sigterm()
    t0 = time.monotonic()
    # converts the embedded model once here, before the servers and this process would race to
    print(
        f"[tta] run dir {cfg.run_dir}; model at {prepare_model(cfg.model.name, cfg.model.cache_dir or None)}",
        flush=True,
    )
    try:
        results = run(cfg, argv)
    except KeyboardInterrupt:
        print("[tta] interrupted; processes stopped", flush=True)
        return 130
    except (RuntimeError, TimeoutError) as exc:
        print(f"[tta] failed: {exc}", flush=True)
        return 1
    print(
        f"[tta] done in {time.monotonic() - t0:.0f}s; scores per trial (also in {cfg.run_path('tta.json')}):\n"
        f"{format_table(results)}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
