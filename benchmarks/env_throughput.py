"""Env-actor throughput: env steps/s of the pipeline for 1, 2, 4 env actors against its two stages
measured alone in the same run, to show which stage bounds the pipeline and how close it gets.

    .venv/bin/python -m benchmarks.env_throughput [--actors 1 2 4] [--window-s 45] [--warmup-s 10] [--quick]

For each actor count N the concurrency is C = N x envs_per_actor (ScienceWorld envs in flight):
  (a) env alone   C threads, one ScienceWorld each (common.scienceworld.ScienceWorld with the
                  pipeline's task, train variations, simplification and step limit), episodes of
                  env.max_steps steps with a random valid action, no LLM: env steps/s.
                  Every decision point (task, history, state) is recorded for (b).
  (b) LLM alone   actors.policy_server.engine.PolicyEngine (the policy server's engine, same config) in
                  this process, C concurrent generations of actor prompts built by
                  actors.env_actor.prompts.PromptBuilder from the observations of (a), with the actors'
                  max tokens, temperature and stop: generations/s = the LLM's bound on env steps/s.
  (c) pipeline    one real policy server and a replay buffer (deploy.launch.Launcher, ports away
                  from the tests'), then N env actor processes; no learner (no weight updates) and
                  p_memory = 0; the buffer never applies backpressure (max_ready_groups large,
                  max_open_groups = C). A stub at the memory endpoint acknowledges the actors'
                  per-episode EpisodeReports (the real service would spend the policy on reflections;
                  no service at all would cost each episode the report's timeout). Env steps/s
                  over a fixed window after a warm-up: completed generations on the server
                  (one per env step, fine-grained) and, as a check, the actors' env_steps counters
                  (counted when an episode is uploaded).
Order per N: (a), (b), (c), (b) again (its rate is the mean of both), so one row's stages see
a similar machine load; the (b) engine and the (c) policy server are started once and kept.
Rates of (a) and (b) are per closed-loop worker: cycles ended in the window over their duration.
Every stage also reports the CPU seconds its processes used per step (psutil, installed with
vLLM): on a shared machine they follow the other tenants' load less than the wall-clock rates.
Report: per N, pipeline steps/s, ratio to (a) and (b), the bottleneck min(a, b) and pipeline /
bottleneck; also the serial bound 1 / (1/a + 1/b): a turn generates then steps, and on a CPU host
both stages share the same cores. Every process started is killed (process groups) at the end,
also on Ctrl-C, SIGTERM or an error. Results: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import psutil

from benchmarks.record import repo_relative, run_header, write_result
from common.metrics import (
    ENV_ACTOR_ENV_STEPS,
    ENV_ACTOR_EPISODES,
    ENV_ACTOR_INVALID_ACTIONS,
    ENV_ACTOR_STEP_SECONDS,
    POLICY_SERVER_GENERATED_TOKENS,
    POLICY_SERVER_PROMPT_TOKENS,
    POLICY_SERVER_READY,
    POLICY_SERVER_REQUEST_LATENCY,
    RoleMetrics,
)
from common.model_prep import resolve_model
from common.process import exit_on_sigterm
from common.scienceworld import ScienceWorld
from common.server import serve_requests
from deploy.launch import Launcher
from deploy.monitor import scrape, total
from pipeline.config import PipelineConfig, load_config
from pipeline.roles import run_roles
from protocol.messages import Ack, EpisodeReport, MemoryQuery, MemoryResult, Ping, Pong

HERE = Path(__file__).resolve().parent
# below 32768: ports in Linux's ephemeral range (32768-60999) can be taken by any outgoing
# connection (ZeroMQ, py4j, scrapes), and a metrics server then fails to bind
POLICY_PORT, BUFFER_PORT, MEMORY_PORT, METRICS_BASE = 21550, 21560, 21570, 21600
GENERATIONS = f"{POLICY_SERVER_REQUEST_LATENCY}_count"  # one per completed generation
CPUS = os.cpu_count() or 1
POLL_S = 0.5  # the server's generation counter is read this often during the pipeline's window


def overrides(args: argparse.Namespace, run_dir: str, max_envs: int) -> list[str]:
    """The pipeline config of every stage: conf/pipeline.yaml plus ports, no memory, no backpressure."""
    return [
        f"endpoints.policy_servers=[tcp://127.0.0.1:{POLICY_PORT}]",
        f"endpoints.replay_buffer=tcp://127.0.0.1:{BUFFER_PORT}",
        f"endpoints.memory_service=tcp://127.0.0.1:{MEMORY_PORT}",
        f"metrics.base_port={METRICS_BASE}",
        f"run_dir={run_dir}",
        "replay_buffer.p_memory=0",
        f"replay_buffer.max_open_groups={max_envs}",
        "replay_buffer.max_ready_groups=1000000",
        *([f"env_actor.envs_per_actor={args.envs_per_actor}"] if args.envs_per_actor else []),
        *args.overrides,
    ]


@dataclass
class Rate:
    concurrency: int
    steps_per_s: float  # env steps (a, c) or generations (b) per second over the window
    count: int  # completed in the window
    window_s: float
    load_average: float  # 1-minute load average when the window started
    cpu_s: float = 0.0  # CPU seconds (user + system) the stage's processes used in the window
    extra: dict = field(default_factory=dict)

    @property
    def cpu_s_per_step(self) -> float:
        return self.cpu_s / max(self.count, 1)


class CpuMeter:
    """CPU seconds used by some process trees (the roots and all their descendants) since start().
    On a shared machine wall-clock rates follow the other tenants' load; CPU seconds per step
    follow it far less, so every stage reports both."""

    def __init__(self, roots: list[int], exclude: list[int] = ()):
        self.roots, self.exclude = roots, exclude  # exclude: trees not to count (the pipeline's, while idle)
        self.before: dict[int, float] = {}

    @staticmethod
    def _tree(pids) -> list[psutil.Process]:
        procs = []
        for pid in pids:
            try:
                root = psutil.Process(pid)
                procs += [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        return procs

    def _sample(self) -> dict[int, float]:
        excluded = {p.pid for p in self._tree(self.exclude)}
        used = {}
        for proc in self._tree(self.roots):
            if proc.pid in excluded:
                continue
            try:
                t = proc.cpu_times()
                used[proc.pid] = t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return used

    def start(self) -> None:
        self.before = self._sample()

    def stop(self) -> float:
        """CPU seconds since start(); a process started meanwhile counts whole, one ended meanwhile not at all."""
        return sum(cpu - self.before.get(pid, 0.0) for pid, cpu in self._sample().items())


def window_rate(done: dict[int, list[float]], t_start: float, t0: float, t1: float) -> tuple[int, float]:
    """(completions in [t0, t1), completions/s). Each worker is a closed loop whose cycles follow
    one another from t_start on, so its rate is the number of cycles that ended in the window over
    their summed duration (back to the completion before the first of them): every completion
    counts, whatever its phase against the window edges, which matters when one generation takes
    a good part of the window."""
    n, rate = 0, 0.0
    for times in done.values():
        bounds = [t_start, *times]
        inside = [i for i in range(1, len(bounds)) if t0 <= bounds[i] < t1]
        if inside:
            n += len(inside)
            rate += len(inside) / (bounds[inside[-1]] - bounds[inside[0] - 1])
    return n, rate


def counter_rate(samples: list[tuple[float, float]]) -> float:
    """Rate of a polled counter between its first and last increase in [(time, value), ...]."""
    changes = [(t, v) for (t, v), (_, before) in zip(samples[1:], samples) if v > before]
    if len(changes) < 2:
        return (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
    (ta, va), (tb, vb) = changes[0], changes[-1]
    return (vb - va) / (tb - ta)


# ---------------------------------------------------------------------------- (a) ScienceWorld alone
@dataclass
class Decision:
    """What an actor's prompt is built from at one step (EpisodeRunner.play)."""

    task: str
    history: list[tuple[str, str]]  # (state shown, action taken) of each past turn
    state: str


def env_alone(
    cfg: PipelineConfig,
    envs: list[ScienceWorld],
    targets: list[tuple[str, int]],
    warmup_s: float,
    window_s: float,
    seed: int,
    decisions: list[Decision],
    exclude: list[int],
) -> Rate:
    max_steps = cfg.env.max_steps
    done: dict[int, list[float]] = {k: [] for k in range(len(envs))}
    episode_lengths: list[int] = []
    t_start = time.perf_counter()
    t0, t1 = t_start + warmup_s, t_start + warmup_s + window_s

    def play(k: int, env: ScienceWorld) -> None:
        rng = random.Random(seed + k)
        episode = k
        while time.perf_counter() < t1:
            task, variation = targets[episode % len(targets)]
            episode += len(envs)
            result = env.reset(task, variation)
            history: list[tuple[str, str]] = []
            for step in range(max_steps):  # noqa: B007 (the episode length, read after the loop)
                decisions.append(Decision(env.task_description, list(history), result.state))
                action = rng.choice(result.valid_actions)
                history.append((result.state, action))
                result = env.step(action)
                done[k].append(time.perf_counter())
                if result.done or time.perf_counter() >= t1:
                    break
            episode_lengths.append(step + 1)

    threads = [threading.Thread(target=play, args=(k, env), daemon=True) for k, env in enumerate(envs)]
    meter = CpuMeter([os.getpid()], exclude)  # this process's env threads and their JVMs (the idle engine too)
    for t in threads:
        t.start()
    time.sleep(max(t0 - time.perf_counter(), 0))
    load = os.getloadavg()[0]
    meter.start()
    time.sleep(max(t1 - time.perf_counter(), 0))
    cpu_s = meter.stop()
    for t in threads:
        t.join()
    n, rate = window_rate(done, t_start, t0, t1)
    return Rate(len(envs), rate, n, window_s, load, cpu_s, {"mean_episode_steps": float(np.mean(episode_lengths))})


# ---------------------------------------------------------------------------- (b) vLLM alone
async def llm_alone(
    engine,
    prompts: list[np.ndarray],
    cfg: PipelineConfig,
    concurrency: int,
    warmup_s: float,
    window_s: float,
    tag: str,
    exclude: list[int],
) -> Rate:
    acfg = cfg.env_actor
    done: dict[int, list[float]] = {k: [] for k in range(concurrency)}
    tokens: list[int] = []
    latencies: list[float] = []
    t_start = time.perf_counter()
    t0, t1 = t_start + warmup_s, t_start + warmup_s + window_s

    async def worker(k: int) -> None:
        i = k
        while time.perf_counter() < t1:
            # the request an actor sends (EnvWorker.generate), served as the policy server does
            req = acfg.action_request(f"{tag}-{i}", prompts[i % len(prompts)], seed=i)
            t = time.perf_counter()
            out = await engine.generate(req)
            done[k].append(time.perf_counter())
            tokens.append(len(out.token_ids))
            if t0 <= done[k][-1] < t1:
                latencies.append(done[k][-1] - t)
            i += concurrency

    async def measure_cpu() -> tuple[float, float]:
        meter = CpuMeter([os.getpid()], exclude)  # this process and the engine's processes
        await asyncio.sleep(max(t0 - time.perf_counter(), 0))
        load = os.getloadavg()[0]
        meter.start()
        await asyncio.sleep(max(t1 - time.perf_counter(), 0))
        return load, meter.stop()

    (load, cpu_s), *_ = await asyncio.gather(measure_cpu(), *(worker(k) for k in range(concurrency)))
    n, rate = window_rate(done, t_start, t0, t1)
    return Rate(
        concurrency,
        rate,
        n,
        window_s,
        load,
        cpu_s,
        {"mean_generated_tokens": float(np.mean(tokens)), "mean_generation_s": float(np.mean(latencies))},
    )


def prompt_builder(cfg: PipelineConfig):
    from transformers import AutoTokenizer

    from actors.env_actor.prompts import PromptBuilder

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg.model.name, cfg.model.cache_dir or None))
    budget = cfg.env_actor.prompt_budget(cfg.policy_server.max_model_len)
    return PromptBuilder(tokenizer, cfg.env_actor.history_window, budget)


def build_prompts(builder, decisions: list[Decision], limit: int, seed: int) -> list[np.ndarray]:
    """The actors' chat prompts of the recorded decisions, without the demonstration and the action
    templates (the env-alone stage does not load gold paths)."""
    from actors.env_actor.prompts import TaskContext

    picked = random.Random(seed).sample(decisions, min(limit, len(decisions)))
    return [
        builder.build(TaskContext(d.task), [builder.past_turn(s, [], a) for s, a in d.history], d.state, []).token_ids
        for d in picked
    ]


def merge(before: Rate, after: Rate) -> Rate:
    """(b) measured before and after (c): their mean, so a change of the machine's load between
    the stages shows up in both the bound and the pipeline."""
    extra = {k: (before.extra[k] + after.extra[k]) / 2 for k in before.extra}
    extra["steps_per_s_before_after"] = [before.steps_per_s, after.steps_per_s]
    return Rate(
        before.concurrency,
        (before.steps_per_s + after.steps_per_s) / 2,
        before.count + after.count,
        before.window_s + after.window_s,
        (before.load_average + after.load_average) / 2,
        before.cpu_s + after.cpu_s,
        extra,
    )


# ---------------------------------------------------------------------------- (c) the pipeline
def memory_stub(endpoint: str) -> None:
    """Answers what an actor sends the memory service (p_memory = 0: only per-episode reports)."""

    handlers = {
        Ping: lambda msg: Pong(role="memory_service", policy_version=0, ready=True),
        MemoryQuery: lambda msg: MemoryResult(tips=[], scores=[], count=0),
        EpisodeReport: lambda msg: Ack(ref=msg.episode_id),
    }
    threading.Thread(target=serve_requests, args=(endpoint, handlers, RoleMetrics("memory_stub")), daemon=True).start()


def pipeline_counts(cfg: PipelineConfig, actors: int, actor_metrics: bool = True) -> dict[str, float]:
    host, m = cfg.metrics.host, cfg.metrics
    server = scrape(host, m.port("policy_server", 0))
    per_actor = [scrape(host, m.port("env_actor", j)) for j in range(actors)] if actor_metrics else []
    return {
        "generations": total(server, GENERATIONS),
        "generated_tokens": total(server, POLICY_SERVER_GENERATED_TOKENS),
        "prompt_tokens": total(server, POLICY_SERVER_PROMPT_TOKENS),
        "generation_seconds": total(server, f"{POLICY_SERVER_REQUEST_LATENCY}_sum"),
        "turn_seconds": sum(total(a, f"{ENV_ACTOR_STEP_SECONDS}_sum") for a in per_actor),
        "turns": sum(total(a, f"{ENV_ACTOR_STEP_SECONDS}_count") for a in per_actor),
        "actor_env_steps": sum(total(a, ENV_ACTOR_ENV_STEPS) for a in per_actor),
        "episodes": sum(total(a, ENV_ACTOR_EPISODES) for a in per_actor),
        "invalid_actions": sum(total(a, ENV_ACTOR_INVALID_ACTIONS) for a in per_actor),
        "actors_with_episodes": sum(total(a, ENV_ACTOR_EPISODES) > 0 for a in per_actor),
    }


def wait_for_server(cfg: PipelineConfig, server: Launcher, timeout_s: float) -> None:
    """Until the policy server's engine is up (its start-up would disturb the first measurements)."""
    deadline = time.monotonic() + timeout_s
    while total(scrape(cfg.metrics.host, cfg.metrics.port("policy_server", 0)), POLICY_SERVER_READY) < 1:
        server.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"policy server not ready within {timeout_s:.0f}s:\n{server.children[0].tail()}")
        time.sleep(1.0)


def pipeline_run(
    base_overrides: list[str],
    actors: int,
    envs_per_actor: int,
    server: Launcher,
    warmup_s: float,
    window_s: float,
    timeout_s: float,
) -> Rate:
    cfg = load_config([*base_overrides, f"launch.num_env_actors={actors}"])
    launcher = Launcher(cfg, base_overrides, roles=[r for r in run_roles(cfg) if r[0].startswith("env_actor")])
    try:
        launcher.start()
        t_start = time.monotonic()
        while pipeline_counts(cfg, actors)["actors_with_episodes"] < actors:  # every actor plays
            server.check_alive()
            launcher.check_alive()
            if time.monotonic() - t_start > timeout_s:
                raise RuntimeError(
                    f"not every actor finished an episode within {timeout_s:.0f}s:\n"
                    + "\n".join(c.tail(10) for c in launcher.children)
                )
            time.sleep(1.0)
        ready_s = time.monotonic() - t_start
        time.sleep(warmup_s)
        load = os.getloadavg()[0]
        meter = CpuMeter([c.process.pid for c in server.children + launcher.children])  # server, buffer, actors
        meter.start()
        before, t0 = pipeline_counts(cfg, actors), time.perf_counter()
        polled = [(t0, before["generations"])]
        while time.perf_counter() < t0 + window_s:
            time.sleep(POLL_S)
            polled.append((time.perf_counter(), pipeline_counts(cfg, actors, actor_metrics=False)["generations"]))
        after, t1 = pipeline_counts(cfg, actors), time.perf_counter()
        cpu_s = meter.stop()
        server.check_alive()
        launcher.check_alive()
    finally:
        launcher.stop()
    delta = {k: after[k] - before[k] for k in before if k != "actors_with_episodes"}
    seconds = t1 - t0
    extra = {
        "actor_env_steps_per_s": delta["actor_env_steps"] / seconds,
        "episodes": delta["episodes"],
        "mean_episode_steps": delta["actor_env_steps"] / max(delta["episodes"], 1),
        "mean_generated_tokens": delta["generated_tokens"] / max(delta["generations"], 1),
        "mean_prompt_tokens": delta["prompt_tokens"] / max(delta["generations"], 1),
        # per turn: the actor's wall time (generate + env step), of which the server's generation latency
        "mean_turn_s": delta["turn_seconds"] / max(delta["turns"], 1),
        "mean_server_generation_s": delta["generation_seconds"] / max(delta["generations"], 1),
        "invalid_action_fraction": delta["invalid_actions"] / max(delta["actor_env_steps"], 1),
        "actors_ready_s": ready_s,
    }
    extra["generations_over_window_per_s"] = delta["generations"] / seconds
    extra["polled_generations"] = [(round(t - t0, 2), v) for t, v in polled]  # (s into the window, server count)
    return Rate(actors * envs_per_actor, counter_rate(polled), int(delta["generations"]), seconds, load, cpu_s, extra)


# ---------------------------------------------------------------------------- report
def analyse(actors: int, a: Rate, b: Rate, c: Rate) -> dict:
    bottleneck = min(a.steps_per_s, b.steps_per_s)
    serial = 1 / (1 / a.steps_per_s + 1 / b.steps_per_s)
    return {
        "actors": actors,
        "concurrency": c.concurrency,
        "pipeline_steps_per_s": c.steps_per_s,
        "env_alone_steps_per_s": a.steps_per_s,
        "llm_alone_generations_per_s": b.steps_per_s,
        "pipeline_over_env": c.steps_per_s / a.steps_per_s,
        "pipeline_over_llm": c.steps_per_s / b.steps_per_s,
        "bottleneck": "env (a)" if a.steps_per_s <= b.steps_per_s else "LLM (b)",
        "bottleneck_steps_per_s": bottleneck,
        "pipeline_over_bottleneck": c.steps_per_s / bottleneck,
        "serial_bound_steps_per_s": serial,
        "pipeline_over_serial_bound": c.steps_per_s / serial,
        # CPU seconds per step, less sensitive to the other tenants of the machine than the rates
        "cpu_s_per_step_env": a.cpu_s_per_step,
        "cpu_s_per_generation_llm": b.cpu_s_per_step,
        "cpu_s_per_step_pipeline": c.cpu_s_per_step,
        "cpu_share": {
            "env": a.cpu_s / a.window_s / CPUS,
            "llm": b.cpu_s / b.window_s / CPUS,
            "pipeline": c.cpu_s / c.window_s / CPUS,
        },
        "pipeline_cpu_efficiency": (a.cpu_s_per_step + b.cpu_s_per_step) / c.cpu_s_per_step,
        "cpu_bound_steps_per_s": CPUS / (a.cpu_s_per_step + b.cpu_s_per_step),
    }


def print_table(rows: list[dict]) -> None:
    print(
        f"\n{'actors':>6} {'envs':>4} {'pipeline':>9} {'(a) env':>8} {'(b) LLM':>8} {'÷(a)':>6} {'÷(b)':>6} "
        f"{'bound by':>9} {'÷bottleneck':>12} {'serial':>7} {'÷serial':>8}"
    )
    for r in rows:
        print(
            f"{r['actors']:>6} {r['concurrency']:>4} {r['pipeline_steps_per_s']:>9.2f} {r['env_alone_steps_per_s']:>8.2f} "
            f"{r['llm_alone_generations_per_s']:>8.2f} {r['pipeline_over_env']:>6.2f} {r['pipeline_over_llm']:>6.2f} "
            f"{r['bottleneck']:>9} {r['pipeline_over_bottleneck']:>12.2f} {r['serial_bound_steps_per_s']:>7.2f} "
            f"{r['pipeline_over_serial_bound']:>8.2f}"
        )
    print("steps/s; envs = actors x envs_per_actor = concurrency of (a) and (b); serial = 1/(1/a + 1/b)")
    print(
        f"\n{'actors':>6} {'CPU-s/step: (a)':>16} {'(b)':>6} {'(c)':>6} {'(a)+(b) / (c)':>14} {'CPU bound':>10} "
        f"{'CPU share: (a)':>15} {'(b)':>5} {'(c)':>5}"
    )
    for r in rows:
        share = r["cpu_share"]
        print(
            f"{r['actors']:>6} {r['cpu_s_per_step_env']:>16.3f} {r['cpu_s_per_generation_llm']:>6.2f} "
            f"{r['cpu_s_per_step_pipeline']:>6.2f} {r['pipeline_cpu_efficiency']:>14.2f} {r['cpu_bound_steps_per_s']:>10.2f} "
            f"{share['env']:>15.2f} {share['llm']:>5.2f} {share['pipeline']:>5.2f}"
        )
    print(
        f"CPU-s/step: CPU seconds of the stage's processes per step in the window; (a)+(b) / (c): the pipeline's CPU "
        f"efficiency; CPU bound: {CPUS} cores / ((a)+(b)) steps/s; share: of all {CPUS} cores"
    )


def print_details(actors: list[int], env_rates: list[Rate], llm_rates: list[Rate], pipeline_rates: list[Rate]) -> None:
    print(
        f"\n{'actors':>6} | {'(a) ep. steps':>13} | {'(b) gen s':>9} {'tokens':>6} | {'(c) turn s':>10} {'server gen s':>12} "
        f"{'tokens':>6} {'prompt':>6} {'ep. steps':>9} {'actor ctr/s':>11} {'load':>5}"
    )
    for n, a, b, c in zip(actors, env_rates, llm_rates, pipeline_rates):
        e = c.extra
        print(
            f"{n:>6} | {a.extra['mean_episode_steps']:>13.2f} | {b.extra['mean_generation_s']:>9.2f} "
            f"{b.extra['mean_generated_tokens']:>6.1f} | {e['mean_turn_s']:>10.2f} {e['mean_server_generation_s']:>12.2f} "
            f"{e['mean_generated_tokens']:>6.1f} {e['mean_prompt_tokens']:>6.0f} {e['mean_episode_steps']:>9.2f} "
            f"{e['actor_env_steps_per_s']:>11.2f} {c.load_average:>5.1f}"
        )
    print(
        "turn s: an actor's wall time per turn (generate + env step); server gen s: the server's latency per "
        "generation; actor ctr/s: steps/s from the actors' counters (whole episodes only)"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4], help="env actor process counts")
    parser.add_argument("--envs-per-actor", type=int, default=0, help="0 = env_actor.envs_per_actor of the config")
    parser.add_argument("--window-s", type=float, default=45.0, help="pipeline measurement window per actor count")
    parser.add_argument(
        "--warmup-s", type=float, default=10.0, help="pipeline warm-up after every actor finished an episode"
    )
    parser.add_argument(
        "--stage-window-s", type=float, default=25.0, help="measurement window of (a) and (b) per concurrency"
    )
    parser.add_argument("--stage-warmup-s", type=float, default=5.0, help="warm-up of (a) and (b) per concurrency")
    parser.add_argument("--prompts", type=int, default=256, help="distinct prompts from (a)'s observations for (b)")
    parser.add_argument("--quick", action="store_true", help="smoke setting: 1 actor, short windows (~2-3 min)")
    parser.add_argument("--start-timeout-s", type=float, default=600.0)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "env_throughput.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="extra config overrides key=value (task, max_steps, ...)")
    args = parser.parse_args(argv)
    if args.quick:
        args.actors, args.window_s, args.warmup_s, args.stage_window_s, args.stage_warmup_s = [1], 30.0, 5.0, 15.0, 5.0
    return args


@dataclass
class Measured:
    """The three stages' rates per actor count, and what stage (b) ran on."""

    engine_start_s: float = 0.0
    env_rates: list[Rate] = field(default_factory=list)
    llm_rates: list[Rate] = field(default_factory=list)
    pipeline_rates: list[Rate] = field(default_factory=list)
    prompts: list[np.ndarray] = field(default_factory=list)  # (b)'s prompts of the last actor count


def configure(args: argparse.Namespace, run_dir: str) -> tuple[list[str], PipelineConfig, int, list[int]]:
    """The overrides and config sized for the largest concurrency, the envs per actor and the
    concurrencies (envs in flight) of the actor counts."""
    epa = load_config(overrides(args, run_dir, 1)).env_actor.envs_per_actor
    concurrencies = [n * epa for n in args.actors]
    base = overrides(args, run_dir, max(concurrencies))
    return base, load_config(base), epa, concurrencies


def env_stage(
    args: argparse.Namespace, cfg: PipelineConfig, envs_in_flight: int, n: int, decisions: list[Decision], pids
) -> Rate:
    """(a) ScienceWorld alone, each env built as an actor builds its env (open_episode_runner)."""
    rb = cfg.replay_buffer
    envs: list[ScienceWorld] = []
    try:
        for _ in range(envs_in_flight):
            envs.append(ScienceWorld(cfg.env.simplification, step_limit=max(100, cfg.env.max_steps + 1)))
        targets = [(task, v) for task in rb.tasks for v in envs[0].train_variations(task)[: rb.variations_per_task]]
        return env_alone(cfg, envs, targets, args.stage_warmup_s, args.stage_window_s, args.seed + n, decisions, pids)
    finally:
        for env in envs:
            env.close()


def measure(args: argparse.Namespace, base: list[str], cfg: PipelineConfig, concurrencies: list[int]) -> Measured:
    """Per actor count: (a), (b), (c), (b) again, so the stages of one row see a similar machine
    load. One engine for (b) in this process, one policy server + buffer for (c), both kept."""
    from actors.policy_server.engine import PolicyEngine

    epa = cfg.env_actor.envs_per_actor
    builder = prompt_builder(cfg)
    decisions: list[Decision] = []
    measured = Measured()
    loop = asyncio.new_event_loop()  # the engine's output task lives in this loop between stages
    server = Launcher(cfg, base, roles=[r for r in run_roles(cfg) if r[0] in ("policy_server0", "replay_buffer")])
    engine = None
    try:
        t = time.perf_counter()
        model_path = resolve_model(cfg.model.name, cfg.model.cache_dir or None)
        engine = PolicyEngine(model_path, cfg.policy_server, cfg.seed, cfg.weight_sync.method)
        measured.engine_start_s = time.perf_counter() - t
        memory_stub(cfg.endpoints.memory_service)
        server.start()
        wait_for_server(cfg, server, args.start_timeout_s)
        pipeline_pids = [c.process.pid for c in server.children]
        for n, c in zip(args.actors, concurrencies):
            measured.env_rates.append(env_stage(args, cfg, c, n, decisions, pipeline_pids))
            print(f"[bench] (a) env alone, {c} envs: {measured.env_rates[-1].steps_per_s:.2f} steps/s", flush=True)
            # (b) the policy engine alone on actor prompts from (a)'s observations, before and after (c)
            prompts = build_prompts(builder, decisions, args.prompts, args.seed + n)
            measured.prompts = prompts

            def llm(tag: str, prompts=prompts, c=c, n=n) -> Rate:
                rate = loop.run_until_complete(
                    llm_alone(
                        engine, prompts, cfg, c, args.stage_warmup_s, args.stage_window_s, f"{tag}{n}", pipeline_pids
                    )
                )
                print(f"[bench] (b) LLM alone, {c} in flight: {rate.steps_per_s:.2f} generations/s", flush=True)
                return rate

            before = llm("before")
            # (c) N env actor processes against the policy server and buffer
            pipeline = pipeline_run(base, n, epa, server, args.warmup_s, args.window_s, args.start_timeout_s)
            measured.pipeline_rates.append(pipeline)
            print(
                f"[bench] (c) pipeline, {n} actors: {pipeline.steps_per_s:.2f} steps/s "
                f"(actor counters {pipeline.extra['actor_env_steps_per_s']:.2f})",
                flush=True,
            )
            measured.llm_rates.append(merge(before, llm("after")))
    finally:
        server.stop()
        if engine is not None:
            engine.shutdown()
        loop.close()
    return measured


def report(
    args: argparse.Namespace,
    argv: list[str] | None,
    base: list[str],
    cfg: PipelineConfig,
    measured: Measured,
    wall0: float,
    load_at_start: tuple[float, float, float],
) -> None:
    """The table and details printed, and the result written to --out."""
    acfg, prompts = cfg.env_actor, measured.prompts
    rows = [
        analyse(n, a, b, c)
        for n, a, b, c in zip(args.actors, measured.env_rates, measured.llm_rates, measured.pipeline_rates)
    ]
    wall_s = time.perf_counter() - wall0
    print_table(rows)
    print_details(args.actors, measured.env_rates, measured.llm_rates, measured.pipeline_rates)
    print(
        f"wall time {wall_s:.0f} s; load average at start {load_at_start[0]:.2f}; prompts for (b) "
        f"{len(prompts)} (mean {np.mean([len(p) for p in prompts]):.0f} tokens)"
    )
    result = {
        **run_header(
            [".venv/bin/python", "-m", "benchmarks.env_throughput"],
            argv if argv is not None else sys.argv[1:],
            load_average_at_start=load_at_start,
        ),
        "config": {
            "overrides": base,
            "tasks": cfg.replay_buffer.tasks,
            "variations_per_task": cfg.replay_buffer.variations_per_task,
            "simplification": cfg.env.simplification,
            "max_steps": cfg.env.max_steps,
            "history_window": acfg.history_window,
            "max_action_tokens": acfg.max_action_tokens,
            "temperature": acfg.temperature,
            "envs_per_actor": acfg.envs_per_actor,
            "model": cfg.model.name,
            "policy_server": asdict(cfg.policy_server),
        },
        "settings": {k: (repo_relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "prompts": {"count": len(prompts), "mean_tokens": float(np.mean([len(p) for p in prompts]))},
        "engine_start_s": measured.engine_start_s,
        "env_alone": [asdict(r) for r in measured.env_rates],
        "llm_alone": [asdict(r) for r in measured.llm_rates],
        "pipeline": [asdict(r) for r in measured.pipeline_rates],
        "table": rows,
        "wall_s": wall_s,
    }
    write_result(args.out, result)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    exit_on_sigterm()  # SIGTERM runs the finally blocks of measure like Ctrl-C does
    wall0, load_at_start = time.perf_counter(), os.getloadavg()
    run_dir = tempfile.mkdtemp(prefix="empo2-bench-env-")
    base, cfg, epa, concurrencies = configure(args, run_dir)
    print(
        f"[bench] run dir {run_dir}; tasks {cfg.replay_buffer.tasks}, max_steps {cfg.env.max_steps}, "
        f"envs per actor {epa}, concurrencies {concurrencies}",
        flush=True,
    )
    measured = measure(args, base, cfg, concurrencies)
    report(args, argv, base, cfg, measured, wall0, load_at_start)


if __name__ == "__main__":
    main()
