"""Evaluation (the paper's Table 1): a policy's score and success rate on the test variations.

Scores `eval.policy` ("base": model.name; "latest": the newest checkpoint of <run_dir>/checkpoints;
or a checkpoint directory) as the paper does (docs/method.md, "Reference experimental setup"): the
first eval.variations **test** variations of each of eval.tasks (never a train variation),
eval.episodes episodes per variation (seeds 0..N-1), **no memory** (mode on_policy: the memory
service is neither started nor queried), sampling at eval.temperature (0.4), with the per-task
step limits of `env`. Per task: the mean score and its std over seeds (the mean over the
variations of seed k, then mean and std over k), and the success rate (done and score > 70).

Starts the policy server(s) serving that policy (deploy.launch.Launcher, logs in
<out>/logs), unless eval.reuse_servers: then it plays against endpoints.policy_servers as they
are. Plays in this process with the env actors' episode logic over a pool of eval.envs envs in
parallel (actors.env_actor.EnvActor.play_all), with a progress line and ETA per episode.

Output in <run_dir>/eval/<policy label>/ (label: "base" or the checkpoint's name, step_000042):
  episodes.jsonl  one line per finished episode, appended as it ends: a rerun with the same
                  settings resumes, playing only the episodes not in it
  settings.json   what the episodes were played with (a rerun with other settings is refused)
  results.json, results.csv, table.md   per task, and the paper's EMPO2 and GRPO numbers beside
                  ours where the task is in the paper's Table 1

Sockets (DEALER clients, through actors.env_actor.EnvWorker): policy servers: Ping -> Pong ;
GenerateRequest -> GenerateResponse. Nothing else.

Run: `empo2-eval [eval.policy=latest] [key=value ...]`, e.g.
     `empo2-eval 'eval.tasks=[find-animal]' eval.variations=2 eval.episodes=1 run_dir=runs/x`.
"""

from __future__ import annotations

import copy
import csv
import json
import logging
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from actors.env_actor.episode import Episode
from actors.env_actor.process import EnvActor
from common.logs import setup_logging
from common.metrics import METRICS_LOG
from common.model_prep import prepare_model
from common.process import interrupt_on_sigterm
from deploy.launch import Launcher
from evaluation.config import FIXED_WEIGHTS
from evaluation.stats import bootstrap_ci, pass_at_k
from pipeline.config import PipelineConfig, run_facts
from pipeline.roles import run_roles
from protocol.messages import ON_POLICY, Assignment

log = logging.getLogger("eval")

# The paper's Table 1 (docs/method.md): ScienceWorld test variations, mean ± std, Qwen2.5-7B-Instruct.
PAPER_TABLE_1 = {
    "chemistry-mix": {"EMPO2": (42.7, 12.4), "GRPO": (12.4, 3.5)},
    "chemistry-mix-paint-secondary-color": {"EMPO2": (33.3, 0.6), "GRPO": (7.1, 2.8)},
    "chemistry-mix-paint-tertiary-color": {"EMPO2": (39.2, 8.7), "GRPO": (42.6, 6.2)},
    "find-animal": {"EMPO2": (100.0, 0.0), "GRPO": (72.4, 6.8)},
    "find-living-thing": {"EMPO2": (100.0, 0.0), "GRPO": (68.7, 7.1)},
}
EPISODES_FILE = "episodes.jsonl"
SETTINGS_FILE = "settings.json"


class EvalError(RuntimeError):
    """An evaluation that cannot run as asked (no checkpoint, other settings in its directory)."""


@dataclass(frozen=True)
class PolicyChoice:
    label: str  # names the output directory: "base" or the checkpoint directory's name
    model: str  # what the policy servers load (model.name)


def resolve_policy(cfg: PipelineConfig) -> PolicyChoice:
    choice = cfg.eval.policy
    if choice == "base":
        return PolicyChoice("base", cfg.model.name)
    if choice == "latest":
        from learner.checkpoint import list_checkpoints, model_dir  # torch: only when a checkpoint is scored

        found = list_checkpoints(Path(cfg.run_dir) / "checkpoints")
        if not found:
            raise EvalError(f"eval.policy=latest: no complete checkpoint in {Path(cfg.run_dir) / 'checkpoints'}")
        return PolicyChoice(found[-1].name, str(model_dir(found[-1]).resolve()))
    from learner.checkpoint import model_dir

    path = Path(choice).resolve()
    model = model_dir(path)  # a checkpoint (step_N/model, or the older step_N with the weights) or an HF directory
    if not (model / "config.json").exists():
        raise EvalError(f"eval.policy={choice}: not a checkpoint directory (no config.json); use base, latest or one")
    # named after the checkpoint (step_N) also when given its model directory
    label = path.parent.name if path.name == "model" and path.parent.name.startswith("step_") else path.name
    return PolicyChoice(label, str(model))


def recorded_path(model: str) -> str:
    """A model as results.json records it: a path under the working directory (the repository, where the
    commands run) relative to it, so a committed result names no machine's directories; else as given."""
    path = Path(model)
    return str(path.relative_to(Path.cwd())) if path.is_absolute() and path.is_relative_to(Path.cwd()) else model


def eval_tasks(cfg: PipelineConfig) -> list[str]:
    return list(cfg.eval.tasks or cfg.replay_buffer.tasks)


def settings(cfg: PipelineConfig, policy: PolicyChoice) -> dict:
    """What decides an episode's outcome besides its seed: a resumed evaluation must match them."""
    return {
        "policy": policy.label,
        "model": policy.model,
        "temperature": cfg.eval.temperature,
        # the limits of every task, not only of `tasks`: evaluations of other tasks share the directory
        "max_steps": cfg.env.max_steps,
        "max_steps_per_task": cfg.env.task_limits(),
        "simplification": cfg.env.simplification,
        "env_step_limit": cfg.env.env_step_limit,
        "max_action_tokens": cfg.env_actor.max_action_tokens,
        "history_window": cfg.env_actor.history_window,
        "demonstration": cfg.env_actor.demonstration,
        # SGE: a strategy before the actions (at the evaluation's temperature, without a reflection); named
        # only when on, so the settings of the evaluations from before SGE still match
        **({"strategies": True} if cfg.sge.enabled else {}),
    }


def episode_key(task: str, variation: int, seed: int) -> str:
    return f"{task}/{variation}/{seed}"


def plan(tasks: list[str], test_variations: dict[str, list[int]], variations: int, episodes: int) -> list[Assignment]:
    """The episodes of an evaluation: per task its first `variations` test variations, `episodes` seeds each."""
    return [
        Assignment(group_id=f"eval-{task}-{v}", slot=seed, task=task, variation=v, mode=ON_POLICY, seed=seed)
        for task in tasks
        for v in test_variations[task][:variations]
        for seed in range(episodes)
    ]


class EpisodeLog:
    """<out>/episodes.jsonl: one JSON line per finished episode, appended and flushed as it ends
    (from the env threads, hence the lock). A line cut by an interruption is ignored on reading."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()

    def read(self) -> dict[str, dict]:
        records: dict[str, dict] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    log.warning("skipping a cut line of %s", self.path)
                    continue
                records[episode_key(record["task"], record["variation"], record["seed"])] = record
        return records

    def append(self, record: dict) -> None:
        line = json.dumps(record) + "\n"
        with self._lock, open(self.path, "a") as f:
            f.write(line)
            f.flush()


def episode_record(assignment: Assignment, episode: Episode, seconds: float) -> dict:
    t = episode.trajectory
    return {
        "task": t.task,
        "variation": t.variation,
        "seed": assignment.seed,
        "score": t.score,
        "done": t.done,
        "success": bool(t.success),
        "turns": t.num_turns,
        "policy_versions": sorted(set(t.policy_versions.tolist())),
        "invalid_actions": episode.stats.invalid_actions,
        "seconds": round(seconds, 2),
    }


class Progress:
    """One line per finished episode: count, bar, elapsed time and the ETA at this run's rate."""

    def __init__(self, total: int, done_before: int, width: int = 30):
        self.total, self.done, self.before = total, done_before, done_before
        self.width = width
        self.t0 = time.monotonic()
        self._lock = threading.Lock()

    def update(self, record: dict) -> None:
        with self._lock:
            self.done += 1
            elapsed = time.monotonic() - self.t0
            played = self.done - self.before
            eta = elapsed / played * (self.total - self.done)
            filled = round(self.width * self.done / self.total)
            print(
                f"[eval] {self.done}/{self.total} |{'#' * filled}{'.' * (self.width - filled)}| "
                f"elapsed {_duration(elapsed)} ETA {_duration(eta)}  "
                f"{record['task']} v{record['variation']} seed {record['seed']}: score {record['score']:.0f}"
                f"{' success' if record['success'] else ''}, {record['turns']} steps",
                flush=True,
            )


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


@dataclass
class TaskScore:
    task: str
    variations: int
    episodes: int
    score_mean: float
    score_std: float  # over seeds: std of the per-seed means over variations
    success_rate: float
    seed_means: list[float]
    # Over the k episodes (seeds) of each variation, averaged over variations (SPA's exploration
    # collapse diagnostic: Pass@k far above Pass@1 means the policy can but rarely does):
    k: int = 0  # the fewest seeds a variation has
    pass_at_1: float = 0.0  # success
    pass_at_k: float = 0.0
    pass_score_at_1: float = 0.0  # score >= eval.pass_score
    pass_score_at_k: float = 0.0
    best_of_k: float = 0.0  # the mean over variations of the best score of its k episodes


def summarize(records: list[dict], tasks: list[str], pass_score: float) -> list[TaskScore]:
    rows = []
    for task in tasks:
        mine = [r for r in records if r["task"] == task]
        if not mine:
            continue
        seeds = sorted({r["seed"] for r in mine})
        seed_means = [statistics.fmean(r["score"] for r in mine if r["seed"] == s) for s in seeds]
        by_variation = [[r for r in mine if r["variation"] == v] for v in sorted({r["variation"] for r in mine})]
        k = min(len(episodes) for episodes in by_variation)

        rows.append(
            TaskScore(
                task=task,
                variations=len({r["variation"] for r in mine}),
                episodes=len(mine),
                score_mean=statistics.fmean(seed_means),
                score_std=statistics.stdev(seed_means) if len(seed_means) > 1 else 0.0,
                success_rate=sum(r["success"] for r in mine) / len(mine),
                seed_means=seed_means,
                k=k,
                pass_at_1=_pass_rate(by_variation, lambda r: r["success"], 1),
                pass_at_k=_pass_rate(by_variation, lambda r: r["success"], k),
                pass_score_at_1=_pass_rate(by_variation, lambda r: r["score"] >= pass_score, 1),
                pass_score_at_k=_pass_rate(by_variation, lambda r: r["score"] >= pass_score, k),
                best_of_k=statistics.fmean(max(r["score"] for r in e) for e in by_variation),
            )
        )
    return rows


def _pass_rate(by_variation: list[list[dict]], passed, k: int) -> float:
    """Pass@k averaged over variations, each with its own episodes (seeds)."""
    return statistics.fmean(pass_at_k(len(episodes), sum(map(passed, episodes)), k) for episodes in by_variation)


def _paper(task: str, method: str) -> str:
    if task not in PAPER_TABLE_1:
        return ""
    mean, std = PAPER_TABLE_1[task][method]
    return f"{mean:.1f} ± {std:.1f}"


def markdown_table(
    rows: list[TaskScore], policy: str, variations: int, episodes_per_variation: int, pass_score: float
) -> str:
    lines = [
        f"Policy `{policy}`: test variations, no memory; score mean ± std over seeds (– with one seed); "
        "success = done and score > 70.",
        f"Here the first {variations} test variations x {episodes_per_variation} episodes per task; the paper "
        "(Table 1, Qwen2.5-7B-Instruct): 20 x 4.",
        "",
        f"Pass@1 / Pass@k over the k seeds of each variation: success, then score >= {pass_score:g}; "
        "best-of-k: the mean best score of a variation's k episodes.",
        "",
        "| task | variations x seeds | score | success | Pass@1 / Pass@k | Pass@1 / Pass@k (score) | best-of-k "
        "| paper EMPO2 | paper GRPO |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.task} | {r.variations} x {len(r.seed_means)} | {r.score_mean:.1f} ± "
            f"{f'{r.score_std:.1f}' if len(r.seed_means) > 1 else '–'} | "
            f"{100 * r.success_rate:.0f}% | {r.pass_at_1:.2f} / {r.pass_at_k:.2f} (k={r.k}) | "
            f"{r.pass_score_at_1:.2f} / {r.pass_score_at_k:.2f} | {r.best_of_k:.1f} | "
            f"{_paper(r.task, 'EMPO2')} | {_paper(r.task, 'GRPO')} |"
        )
    if rows:
        mean = statistics.fmean(r.score_mean for r in rows)
        success = statistics.fmean(r.success_rate for r in rows)
        lines.append(f"| **mean** | | {mean:.1f} | {100 * success:.0f}% | | | | | |")
    return "\n".join(lines) + "\n"


def write_results(
    out: Path, meta: dict, rows: list[TaskScore], complete: bool, records: list[dict] | None = None
) -> dict:
    """results.json, results.csv and table.md of the scored `rows`; with the episode `records`, the
    mean score's and success rate's bootstrap 95% intervals over episodes too (for the curves)."""
    report = {**meta, "complete": complete, "tasks": [asdict(r) for r in rows]}
    if rows:
        report["mean_score"] = statistics.fmean(r.score_mean for r in rows)
        report["mean_success_rate"] = statistics.fmean(r.success_rate for r in rows)
    if records:
        report["mean_score_ci"] = bootstrap_ci([r["score"] for r in records])
        report["mean_success_rate_ci"] = bootstrap_ci([float(r["success"]) for r in records])
    (out / "results.json").write_text(json.dumps(report, indent=1))
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["task", "variations", "episodes", "score_mean", "score_std", "success_rate", "k", "pass_at_1"]
            + ["pass_at_k", "pass_score_at_1", "pass_score_at_k", "best_of_k"]
        )
        for r in rows:
            writer.writerow(
                [r.task, r.variations, r.episodes, f"{r.score_mean:.3f}", f"{r.score_std:.3f}", r.success_rate, r.k]
                + [f"{x:.4f}" for x in (r.pass_at_1, r.pass_at_k, r.pass_score_at_1, r.pass_score_at_k, r.best_of_k)]
            )
    table = markdown_table(
        rows, meta["policy"], meta["variations_per_task"], meta["episodes_per_variation"], meta["pass_score"]
    )
    (out / "table.md").write_text(table)
    return report


def check_settings(out: Path, wanted: dict) -> None:
    path = out / SETTINGS_FILE
    if path.exists():
        found = json.loads(path.read_text())
        changed = sorted(k for k in {*found, *wanted} if found.get(k) != wanted.get(k))
        if changed:
            raise EvalError(
                f"{out} holds episodes played with other settings ({', '.join(changed)}); "
                "resume with the same ones, or score into another run_dir"
            )
    path.write_text(json.dumps(wanted, indent=1))


def eval_config(cfg: PipelineConfig, policy: PolicyChoice) -> PipelineConfig:
    """The configuration this process plays with: the scored policy's tokenizer, eval.envs envs."""
    cfg = copy.deepcopy(cfg)
    cfg.model.name = policy.model
    cfg.env_actor.envs_per_actor = cfg.eval.envs
    return cfg


def run(cfg: PipelineConfig, overrides: list[str]) -> dict:
    policy = resolve_policy(cfg)
    tasks = eval_tasks(cfg)
    out = Path(cfg.run_dir) / "eval" / policy.label
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, settings(cfg, policy))
    episodes_log = EpisodeLog(out / EPISODES_FILE)
    meta = {
        "policy": policy.label,
        "model": recorded_path(policy.model),
        "temperature": cfg.eval.temperature,
        "variations_per_task": cfg.eval.variations,
        "episodes_per_variation": cfg.eval.episodes,
        "pass_score": cfg.eval.pass_score,
        "memory": False,
    }
    play_cfg = eval_config(cfg, policy)
    roles = [] if cfg.eval.reuse_servers else [r for r in run_roles(cfg) if r[0].startswith("policy_server")]
    serve = [] if policy.label == "base" else [f"model.name={policy.model}"]
    launcher = Launcher(cfg, [*overrides, *serve, *FIXED_WEIGHTS, f"run_dir={cfg.run_dir}"], roles=roles)
    launcher.log_dir = out / "logs"
    with ExitStack() as cleanup:
        cleanup.callback(launcher.stop)  # registered first, so it runs last and also after a partial start
        pool = EnvActor(play_cfg.env_actor, play_cfg.env, run_facts(play_cfg), play_cfg.sge)
        cleanup.callback(pool.close)
        env = pool.workers[0].env
        assignments = plan(tasks, {t: env.test_variations(t) for t in tasks}, cfg.eval.variations, cfg.eval.episodes)
        done = episodes_log.read()
        todo = [a for a in assignments if episode_key(a.task, a.variation, a.seed) not in done]
        if todo:  # else nothing to serve: the tables are written from the episodes file alone
            launcher.start()
            pool.open()  # the other envs' JVMs load while the servers start
        print(
            f"[eval] {policy.label} ({policy.model}): {len(assignments)} episodes over {len(tasks)} tasks, "
            f"{len(assignments) - len(todo)} already in {episodes_log.path}, {len(todo)} to play on "
            f"{cfg.eval.envs} envs at temperature {cfg.eval.temperature}, no memory",
            flush=True,
        )
        if todo:
            pool.wait_ready(buffer=False, memory=False, on_wait=lambda _endpoint, _left: launcher.check_alive())
            progress = Progress(len(assignments), len(assignments) - len(todo))
            started = time.monotonic()

            def record(i: int, episode: Episode) -> None:
                entry = episode_record(todo[i], episode, time.monotonic() - started)
                episodes_log.append(entry)
                progress.update(entry)

            pool.play_all(todo, cfg.eval.temperature, on_episode=record)
    wanted = {episode_key(a.task, a.variation, a.seed) for a in assignments}
    records = [r for key, r in episodes_log.read().items() if key in wanted]
    report = write_results(
        out, meta, summarize(records, tasks, cfg.eval.pass_score), len(records) == len(assignments), records
    )
    if report["complete"] and todo:  # once per evaluation, when its last episode was played
        append_to_metrics_log(cfg, policy, report)
    report["out_dir"] = str(out)
    return report


def policy_step(policy: PolicyChoice) -> int:
    """The learner step a scored policy is from: 0 for the base model, N for checkpoint step_N."""
    prefix, _, number = policy.label.partition("_")
    return int(number) if prefix == "step" and number.isdigit() else 0


def append_to_metrics_log(cfg: PipelineConfig, policy: PolicyChoice, report: dict) -> None:
    """An "eval" record in the run's metrics log (<run_dir>/metrics.jsonl, beside the learner's
    "step" records), for empo2-plot's evaluation curves."""
    record = {
        "record": "eval",
        "step": policy_step(policy),
        "policy": policy.label,
        "wall_time": time.time(),
        "mean_score": report["mean_score"],
        "mean_success_rate": report["mean_success_rate"],
        **{key: report[key] for key in ("mean_score_ci", "mean_success_rate_ci") if key in report},
        "variations_per_task": report["variations_per_task"],
        "episodes_per_variation": report["episodes_per_variation"],
        "tasks": {t["task"]: {k: t[k] for k in ("score_mean", "score_std", "success_rate")} for t in report["tasks"]},
    }
    with open(cfg.run_path(METRICS_LOG), "a") as f:
        f.write(json.dumps(record) + "\n")


def main(argv: list[str], cfg: PipelineConfig) -> int:
    setup_logging("eval")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # closing ScienceWorld logs harmless tracebacks at INFO
    interrupt_on_sigterm()  # `kill` and test clean-ups take the Ctrl-C path: the started servers are stopped
    t0 = time.monotonic()
    # the embedded model is converted once here, before the servers and this process would race to
    print(f"[eval] run dir {cfg.run_dir}; model at {prepare_model(cfg.model.name, cfg.model.cache_dir or None)}")
    try:
        report = run(cfg, argv)
    except KeyboardInterrupt:
        print("[eval] interrupted; processes stopped; a rerun resumes from the episodes file", flush=True)
        return 130
    except (EvalError, RuntimeError, TimeoutError) as exc:
        print(f"[eval] failed: {exc}", flush=True)
        return 1
    out = Path(report["out_dir"])
    print(f"[eval] done in {time.monotonic() - t0:.0f}s; {out}/table.md:\n{(out / 'table.md').read_text()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
