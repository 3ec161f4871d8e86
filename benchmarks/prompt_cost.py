"""Prompt length and its generation cost per step: the reference prompt against a short baseline.

    .venv/bin/python -m benchmarks.prompt_cost [key=value overrides] [--episodes 5] [--steps 0]
        [--long-episodes 2] [--long-steps 12] [--out benchmarks/results/prompt_cost.json]

1. Records ScienceWorld episodes of the configured task (pipeline.config.load_config; the CPU
   profile by default: find-living-thing, 4 steps) with random valid actions, no LLM: `--episodes`
   episodes of `--steps` turns (0 = env.max_steps), then `--long-episodes` longer ones of
   `--long-steps` (0 = none) to show how the prompt grows (an episode the env ends early is
   shorter). Variations: the first replay_buffer.variations_per_task
   training variations, in turn. "focus on ..." actions are left out of the random choice (a wrong
   focus ends a find-living-thing episode at once). Each turn keeps the state shown and the action.
2. Builds every turn's prompt with the env actor's own PromptBuilder and EpisodeRunner.prompt_parts,
   in two variants:
     (a) reference  the prompt as configured (env_actor.demonstration, demo_max_steps,
                    history_window; default: the demonstration, the whole chat), up to
                    env_actor.prompt_token_budget;
     (b) baseline   no demonstration, history_window=1: the closest the code can still produce to
                    the old "last steps only" prompt (it keeps the action templates in the system
                    part and the last turn as a chat pair; the old prompt had neither).
   No tips (no memory service): a tip mode adds its tip blocks to every user turn of (a).
3. Starts one actors.policy_server.engine.PolicyEngine in this process (the policy server's engine and
   config, the embedded model via common.model_prep.resolve_model) and generates every turn's
   action for both variants as an episode issues them: one request at a time, turn after turn, the
   two variants interleaved (a b, b a, a b, ... turn by turn) so the machine's noise spreads over
   both; the actor's request (env_actor.max_action_tokens, temperature, stop at newline) with the
   actor's seed per turn (episode * TURN_SEEDS + turn), the same for both variants; the engine's
   prefix cache as it comes. The engine's AsyncLLM is tapped to time the first output (prefill +
   first token) and to read the engine's own per-request timings and cached-token counts.
Reports per variant: prompt tokens (mean, max) and cached tokens, seconds per step (wall, mean and
p50), engine seconds per step (prefill + decode as the engine core timed them, which leaves out the
stalls: steps whose wall time exceeds the engine's by more than STALL_S), the ratios a/b, generated
tokens, decode seconds per generated token, prefill time, tokens/s, CPU seconds per step (this
process and the engine's, psutil), a per-turn table; the load average at start, before and after
the timed part and before every generation. Results: benchmarks/README.md,
benchmarks/results/prompt_cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.record import repo_relative, run_header, write_result
from pipeline.config import PipelineConfig, load_config

HERE = Path(__file__).resolve().parent
VARIANTS = ("a", "b")
NAMES = {"a": "reference", "b": "baseline"}
# A step whose wall latency exceeds the engine core's own time for it (scheduled -> last token) by
# more than this counts as a stall (seen: ~5 s, vLLM's shm reader recheck interval, while idle)
STALL_S = 1.0
WARMUP_GENERATIONS = 2  # on a short unrelated prompt, before the timed part (not counted)


# ---------------------------------------------------------------------------- pure logic
def schedule(turns_per_episode: list[int]) -> list[tuple[int, int, str]]:
    """(episode, turn, variant) in the order they are generated: the episodes one after another,
    their turns in order, both variants at every turn, which goes first alternating turn by turn
    over the whole run (a b, b a, a b, ...)."""
    order, k = [], 0
    for e, n in enumerate(turns_per_episode):
        for t in range(n):
            first, second = VARIANTS if k % 2 == 0 else VARIANTS[::-1]
            order += [(e, t, first), (e, t, second)]
            k += 1
    return order


def pick_action(rng: random.Random, valid: list[str]) -> str:
    """A random valid action, "focus on ..." left out while another is valid (in find-living-thing
    a wrong focus ends the episode at once)."""
    pool = [a for a in valid if not a.startswith("focus on")] or valid
    return rng.choice(pool)


def finite(value):
    """`value` with every NaN in it (a figure the engine did not report) as None, for strict JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


# ---------------------------------------------------------------------------- 1. episodes
@dataclass
class Recorded:
    """An episode played with random valid actions: what the prompt builder needs per turn."""

    task: str
    variation: int
    task_description: str
    states: list[str]  # the state shown at each turn
    actions: list[str]  # the action taken at each turn
    env_step_s: list[float]  # ScienceWorld's step() per turn
    done: bool


def record_episodes(env, cfg: PipelineConfig, lengths: list[int], seed: int) -> list[Recorded]:
    rb = cfg.replay_buffer
    targets = [(task, v) for task in rb.tasks for v in env.train_variations(task)[: rb.variations_per_task]]
    rng = random.Random(seed)
    episodes = []
    for e, steps in enumerate(lengths):
        task, variation = targets[e % len(targets)]
        result = env.reset(task, variation)
        states, actions, step_s = [], [], []
        for _ in range(steps):
            action = pick_action(rng, result.valid_actions)
            states.append(result.state)
            actions.append(action)
            t = time.perf_counter()
            result = env.step(action)
            step_s.append(time.perf_counter() - t)
            if result.done:
                break
        episodes.append(Recorded(task, variation, env.task_description, states, actions, step_s, result.done))
    return episodes


# ---------------------------------------------------------------------------- 2. prompts
@dataclass
class Prompt:
    episode: int
    turn: int
    variant: str
    token_ids: np.ndarray
    build_s: float  # PromptBuilder.build
    turns_dropped: int  # past turns left out (history_window or the token budget)


def build_prompts(builder, ctx, ep: Recorded, e: int, variant: str) -> list[Prompt]:
    """Every turn's prompt as EpisodeRunner.play builds it (no tips)."""
    past, prompts = [], []
    for t, (state, action) in enumerate(zip(ep.states, ep.actions)):
        t0 = time.perf_counter()
        built = builder.build(ctx, past, state, [])
        prompts.append(Prompt(e, t, variant, built.token_ids, time.perf_counter() - t0, built.turns_dropped))
        past.append(builder.past_turn(state, [], action))
    return prompts


def system_tokens(tokenizer, ep: Recorded, demo, templates: list[str], demo_steps: list[int]) -> dict:
    """Tokens of the system message's parts (the full demonstration `demo`), and of the whole
    system message for some demo_max_steps values: where the reference prompt's fixed part goes."""
    from actors.env_actor.prompts import Demonstration, TaskContext, system_message

    def n(ctx) -> int:
        return len(tokenizer(system_message(ctx), add_special_tokens=False)["input_ids"])

    bare = n(TaskContext(ep.task_description))
    out = {
        "instructions_and_task": bare,
        "demonstration_actions": len(demo.actions) if demo else 0,
        "demonstration": (n(TaskContext(ep.task_description, demo)) - bare) if demo else 0,
        "action_templates": n(TaskContext(ep.task_description, None, templates)) - bare,
        "action_template_count": len(templates),
        "no_demonstration": n(TaskContext(ep.task_description, None, templates)),
        "by_demo_max_steps": {},
    }
    for k in demo_steps:
        cut = Demonstration(demo.variation, demo.task_description, demo.actions[:k] if k else demo.actions)
        out["by_demo_max_steps"][str(k)] = n(TaskContext(ep.task_description, cut, templates))
    return out


# ---------------------------------------------------------------------------- 3. generation
class Tap:
    """The engine's AsyncLLM, seen through: per request, the time of its first output and the final
    RequestOutput (its engine timings and cached-token count). Everything else passes through."""

    def __init__(self, llm):
        self.llm = llm
        self.seen: dict[str, tuple[float, object]] = {}

    def __getattr__(self, name):
        return getattr(self.llm, name)

    async def generate(self, prompt, params, request_id):
        first, last = None, None
        async for out in self.llm.generate(prompt, params, request_id):
            if first is None:
                first = time.perf_counter()
            last = out
            yield out
        self.seen[request_id] = (first, last)


@dataclass
class Generation:
    episode: int
    turn: int
    variant: str
    prompt_tokens: int
    turns_dropped: int
    build_s: float
    seed: int
    generated_tokens: int
    finish_reason: str
    latency_s: float  # PolicyEngine.generate, start to end: the step's generation cost
    first_output_s: float  # until the first output: queue + prefill + the first token
    cached_tokens: int  # prompt tokens served from the prefix cache (engine's count; -1 unknown)
    engine_prefill_s: float  # engine's first_token_ts - scheduled_ts (nan unknown)
    engine_decode_s: float  # engine's last_token_ts - first_token_ts (nan unknown)
    engine_queue_s: float  # engine's scheduled_ts - queued_ts: waiting in the engine core (nan unknown)
    cpu_s: float  # CPU seconds of this process and the engine's processes during the generation
    load_average: float  # 1-minute, before the generation
    text: str


def engine_times(final) -> tuple[int, float, float, float]:
    """(cached tokens, prefill s, decode s, queue s) of a final RequestOutput, as the engine core
    timed them (RequestStateStats; -1 / nan where it did not)."""
    cached = getattr(final, "num_cached_tokens", None)
    m = getattr(final, "metrics", None)
    prefill = decode = queue = float("nan")
    if m is not None and getattr(m, "first_token_ts", 0) and getattr(m, "scheduled_ts", 0):
        prefill = m.first_token_ts - m.scheduled_ts
        decode = m.last_token_ts - m.first_token_ts
        queue = m.scheduled_ts - m.queued_ts if m.queued_ts else float("nan")
    return (-1 if cached is None else int(cached)), prefill, decode, queue


async def generate_all(
    engine, tap: Tap, cfg: PipelineConfig, prompts: dict, order, meter, warmup_ids: list[int]
) -> list[Generation]:
    from actors.env_actor.episode import TURN_SEEDS

    acfg = cfg.env_actor

    async def one(request_id: str, ids: np.ndarray, seed: int):
        # the request an actor sends (EnvWorker.generate), served as the policy server serves it
        req = acfg.action_request(request_id, ids, seed)
        t = time.perf_counter()
        out = await engine.generate(req)
        return out, t, time.perf_counter()

    warm = np.asarray(warmup_ids, dtype=np.int32)
    for i in range(WARMUP_GENERATIONS):
        await one(f"warmup-{i}", warm, 10_000 + i)
    results = []
    for k, (e, t, v) in enumerate(order):
        p: Prompt = prompts[(e, t, v)]
        seed = e * TURN_SEEDS + t
        load = os.getloadavg()[0]
        meter.start()
        out, t0, t1 = await one(f"{v}-{e}-{t}", p.token_ids, seed)
        cpu = meter.stop()
        first, final = tap.seen.pop(out_request_id(out, v, e, t), (float("nan"), None))
        cached, prefill, decode, queue = engine_times(final)
        g = Generation(
            episode=e,
            turn=t,
            variant=v,
            prompt_tokens=len(p.token_ids),
            turns_dropped=p.turns_dropped,
            build_s=p.build_s,
            seed=seed,
            generated_tokens=len(out.token_ids),
            finish_reason=out.finish_reason,
            latency_s=t1 - t0,
            first_output_s=first - t0,
            cached_tokens=cached,
            engine_prefill_s=prefill,
            engine_decode_s=decode,
            engine_queue_s=queue,
            cpu_s=cpu,
            load_average=load,
            text=out.text,
        )
        results.append(g)
        print(
            f"[bench] {k + 1}/{len(order)} ep {e} turn {t} ({v}): {g.prompt_tokens} prompt tokens "
            f"({max(g.cached_tokens, 0)} cached), {g.generated_tokens} generated, {g.latency_s:.2f} s "
            f"(first output {g.first_output_s:.2f} s), load {load:.1f}",
            flush=True,
        )
    return results


def out_request_id(out, v: str, e: int, t: int) -> str:
    """The request id the engine saw (PolicyEngine adds an attempt suffix only after an abort)."""
    rid = f"{v}-{e}-{t}"
    return rid if not out.retries else f"{rid}-{out.retries}"


# ---------------------------------------------------------------------------- 4. report
def summary(gens: list[Generation]) -> dict:
    lat = [g.latency_s for g in gens]
    gen = [g.generated_tokens for g in gens]
    decode = [g.engine_decode_s for g in gens if not np.isnan(g.engine_decode_s)]
    decode_tokens = [g.generated_tokens - 1 for g in gens if not np.isnan(g.engine_decode_s)]
    prefill = [g.engine_prefill_s for g in gens if not np.isnan(g.engine_prefill_s)]
    uncached = [g.prompt_tokens - max(g.cached_tokens, 0) for g in gens if not np.isnan(g.engine_prefill_s)]
    engine = [g.engine_prefill_s + g.engine_decode_s for g in gens if not np.isnan(g.engine_decode_s)]
    stalls = [g.latency_s - e for g, e in zip(gens, engine) if g.latency_s - e > STALL_S]
    return {
        "steps": len(gens),
        "prompt_tokens_mean": float(np.mean([g.prompt_tokens for g in gens])),
        "prompt_tokens_max": int(max(g.prompt_tokens for g in gens)),
        "cached_tokens_mean": float(np.mean([max(g.cached_tokens, 0) for g in gens])),
        "turns_dropped_max": int(max(g.turns_dropped for g in gens)),
        "seconds_per_step_mean": float(np.mean(lat)),
        "seconds_per_step_p50": percentile(lat, 50),
        "seconds_per_step_max": float(max(lat)),
        # scheduled -> last token as the engine core timed it: the step without the stalls below
        "engine_s_mean": float(np.mean(engine)) if engine else float("nan"),
        "engine_s_p50": percentile(engine, 50),
        # steps whose wall latency exceeds the engine's own time by more than STALL_S, and by how much
        "stalls": len(stalls),
        "stall_s_mean": float(np.mean(stalls)) if stalls else 0.0,
        "first_output_s_mean": float(np.mean([g.first_output_s for g in gens])),
        "engine_prefill_s_mean": float(np.mean(prefill)) if prefill else float("nan"),
        "prefill_tokens_per_s": float(sum(uncached) / sum(prefill)) if prefill and sum(prefill) > 0 else float("nan"),
        "generated_tokens_mean": float(np.mean(gen)),
        "generated_tokens_per_s": float(sum(gen) / sum(lat)),
        "decode_s_per_token": float(sum(decode) / sum(decode_tokens)) if sum(decode_tokens) > 0 else float("nan"),
        "cpu_s_per_step": float(np.mean([g.cpu_s for g in gens])),
        "build_s_mean": float(np.mean([g.build_s for g in gens])),
        "load_average_mean": float(np.mean([g.load_average for g in gens])),
    }


def compare(gens: list[Generation]) -> dict:
    by = {v: summary([g for g in gens if g.variant == v]) for v in VARIANTS}
    a, b = by["a"], by["b"]
    return {
        **by,
        "ratio_a_b": {
            "prompt_tokens_mean": a["prompt_tokens_mean"] / b["prompt_tokens_mean"],
            "seconds_per_step_mean": a["seconds_per_step_mean"] / b["seconds_per_step_mean"],
            "seconds_per_step_p50": a["seconds_per_step_p50"] / b["seconds_per_step_p50"],
            "engine_s_mean": a["engine_s_mean"] / b["engine_s_mean"],
            "engine_s_p50": a["engine_s_p50"] / b["engine_s_p50"],
            "cpu_s_per_step": a["cpu_s_per_step"] / b["cpu_s_per_step"] if b["cpu_s_per_step"] > 0 else float("nan"),
            # per step, the generation lengths differ: latency per generated token evens that out
            "seconds_per_generated_token": (a["seconds_per_step_mean"] / a["generated_tokens_mean"])
            / (b["seconds_per_step_mean"] / b["generated_tokens_mean"]),
        },
    }


def per_turn(gens: list[Generation]) -> list[dict]:
    rows = []
    for t in sorted({g.turn for g in gens}):
        row = {"turn": t}
        for v in VARIANTS:
            at = [g for g in gens if g.turn == t and g.variant == v]
            row[f"{v}_prompt_tokens"] = float(np.mean([g.prompt_tokens for g in at]))
            row[f"{v}_seconds"] = float(np.mean([g.latency_s for g in at]))
            row[f"{v}_engine_s"] = float(np.mean([g.engine_prefill_s + g.engine_decode_s for g in at]))
            row[f"{v}_cached_tokens"] = float(np.mean([max(g.cached_tokens, 0) for g in at]))
            row[f"{v}_generated_tokens"] = float(np.mean([g.generated_tokens for g in at]))
        row["episodes"] = len([g for g in gens if g.turn == t and g.variant == "a"])
        rows.append(row)
    return rows


def print_report(parts: dict[str, dict], turns: list[dict]) -> None:
    print()
    print(
        f"{'episodes':<9} {'variant':<9} {'steps':>5} {'prompt tok mean/max':>19} {'cached':>6} "
        f"{'s/step mean/p50':>15} {'engine s mean/p50':>17} {'stalls':>6} {'gen tok':>7} {'tok/s':>5} "
        f"{'s/gen tok':>9} {'prefill s':>9} {'CPU-s':>5}"
    )
    for part, comp in parts.items():
        for v in VARIANTS:
            s = comp[v]
            print(
                f"{part:<9} {NAMES[v]:<9} {s['steps']:>5} "
                f"{s['prompt_tokens_mean']:>11.0f} / {s['prompt_tokens_max']:<5} {s['cached_tokens_mean']:>6.0f} "
                f"{s['seconds_per_step_mean']:>7.2f} / {s['seconds_per_step_p50']:<5.2f} "
                f"{s['engine_s_mean']:>9.2f} / {s['engine_s_p50']:<5.2f} {s['stalls']:>6} "
                f"{s['generated_tokens_mean']:>7.1f} {s['generated_tokens_per_s']:>5.1f} "
                f"{s['decode_s_per_token']:>9.3f} {s['engine_prefill_s_mean']:>9.3f} {s['cpu_s_per_step']:>5.2f}"
            )
        r = comp["ratio_a_b"]
        print(
            f"{part:<9} a/b       prompt tokens {r['prompt_tokens_mean']:.2f}x; s/step mean "
            f"{r['seconds_per_step_mean']:.2f}x, p50 {r['seconds_per_step_p50']:.2f}x; engine s mean "
            f"{r['engine_s_mean']:.2f}x, p50 {r['engine_s_p50']:.2f}x; per generated token "
            f"{r['seconds_per_generated_token']:.2f}x; CPU-s {r['cpu_s_per_step']:.2f}x"
        )
    print("\nper turn (all episodes): turn  a tokens  b tokens  a s  b s  a engine s  b engine s  (episodes)")
    for row in turns:
        print(
            f"{row['turn']:>29} {row['a_prompt_tokens']:>9.0f} {row['b_prompt_tokens']:>9.0f} "
            f"{row['a_seconds']:>5.2f} {row['b_seconds']:>5.2f} {row['a_engine_s']:>10.2f} {row['b_engine_s']:>11.2f}"
            f"  ({row['episodes']})"
        )


# ---------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=5, help="episodes of --steps turns")
    parser.add_argument("--steps", type=int, default=0, help="turns per episode; 0 = env.max_steps")
    parser.add_argument("--long-episodes", type=int, default=2, help="then this many episodes of --long-steps")
    parser.add_argument("--long-steps", type=int, default=12, help="turns of the long episodes; 0 = none")
    parser.add_argument("--demo-steps", type=int, nargs="*", default=[3, 6, 10], help="demo_max_steps values sized")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "prompt_cost.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="config overrides key=value (profile, task, env_actor.*, ...)")
    return parser.parse_args(argv)


@dataclass
class Recording:
    """Steps 1-2: the episodes and every turn's prompt in both variants."""

    episodes: list[Recorded]
    prompts: dict[tuple[int, int, str], Prompt]  # (episode, turn, variant)
    contexts: list[dict]  # per episode: the variation played and the demonstration's
    sizes: list[dict]  # per episode: system_tokens
    seconds: float  # recording the episodes


@dataclass
class Timing:
    """Step 3: every generation, and the conditions it ran in."""

    gens: list[Generation]
    engine_start_s: float
    timed_s: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]


def record_prompts(cfg: PipelineConfig, builders: dict, tokenizer, lengths: list[int], steps: int, args) -> Recording:
    """1-2. episodes, and every turn's prompt in both variants (the actor's prompt parts per episode)."""
    from actors.env_actor.episode import EpisodeRunner
    from actors.env_actor.prompts import TaskContext
    from common.scienceworld import ScienceWorld

    acfg, ecfg = cfg.env_actor, cfg.env
    env = ScienceWorld(ecfg.simplification, step_limit=ecfg.env_step_limit, max_heap_mb=ecfg.jvm_max_heap_mb)
    try:
        t = time.perf_counter()
        episodes = record_episodes(env, cfg, lengths, args.seed)
        record_s = time.perf_counter() - t
        runner = EpisodeRunner(
            env, builders["a"], steps, demo_steps=acfg.demo_max_steps if acfg.demonstration else None
        )
        full = EpisodeRunner(env, builders["a"], steps, demo_steps=0)  # the whole gold path, for the sizes
        prompts, contexts, sizes = {}, [], []
        for e, ep in enumerate(episodes):
            demo, templates = runner.prompt_parts(ep.task, ep.variation)
            whole, _ = full.prompt_parts(ep.task, ep.variation)
            ctx = {
                "a": TaskContext(ep.task_description, demo, templates),
                "b": TaskContext(ep.task_description, None, templates),
            }
            contexts.append({"variation": ep.variation, "demo_variation": demo.variation if demo else None})
            sizes.append(system_tokens(tokenizer, ep, whole, templates, args.demo_steps))
            for v in VARIANTS:
                for p in build_prompts(builders[v], ctx[v], ep, e, v):
                    prompts[(e, p.turn, v)] = p
    finally:
        env.close()
    return Recording(episodes, prompts, contexts, sizes, record_s)


def time_generations(cfg: PipelineConfig, model_path: str, tokenizer, recording: Recording) -> Timing:
    """3. one engine, every turn of both variants, interleaved."""
    from actors.policy_server.engine import PolicyEngine
    from benchmarks.env_throughput import CpuMeter

    order = schedule([len(ep.states) for ep in recording.episodes])
    loop = asyncio.new_event_loop()
    engine = None
    try:
        t = time.perf_counter()
        engine = PolicyEngine(model_path, cfg.policy_server, cfg.seed, cfg.weight_sync.method)
        engine_start_s = time.perf_counter() - t
        print(f"[bench] engine up in {engine_start_s:.0f} s", flush=True)
        hello = [{"role": "user", "content": "Say hello."}]
        warmup_text = tokenizer.apply_chat_template(hello, tokenize=False, add_generation_prompt=True)
        warmup_ids = tokenizer(warmup_text, add_special_tokens=False)["input_ids"]
        tap = Tap(engine.engine)
        engine.engine = tap
        load_before = os.getloadavg()
        t = time.perf_counter()
        gens = loop.run_until_complete(
            generate_all(engine, tap, cfg, recording.prompts, order, CpuMeter([os.getpid()]), warmup_ids)
        )
        timed_s = time.perf_counter() - t
        load_after = os.getloadavg()
    finally:
        if engine is not None:
            engine.shutdown()  # vLLM's AsyncLLM.__del__ may still print an ignored TypeError at exit: harmless
        loop.close()
    return Timing(gens, engine_start_s, timed_s, load_before, load_after)


def report(
    args,
    argv: list[str] | None,
    cfg: PipelineConfig,
    budget: int,
    steps: int,
    recording: Recording,
    timing: Timing,
    wall0: float,
    load_at_start: tuple[float, float, float],
) -> None:
    """4. the comparison printed, and the result written to --out."""
    acfg, ecfg, gens = cfg.env_actor, cfg.env, timing.gens
    short = [g for g in gens if g.episode < args.episodes]
    parts = {f"{args.episodes}x{steps}": compare(short)}
    if args.long_steps and args.long_episodes:
        parts[f"{args.long_episodes}x{args.long_steps}"] = compare([g for g in gens if g.episode >= args.episodes])
    parts["all"] = compare(gens)
    turns = per_turn(gens)
    print_report(parts, turns)
    wall_s = time.perf_counter() - wall0
    sizes = recording.sizes
    print(
        f"\nwall time {wall_s:.0f} s (engine start {timing.engine_start_s:.0f} s, timed part {timing.timed_s:.0f} s); "
        f"load average at start {load_at_start[0]:.2f}, before timing {timing.load_before[0]:.2f}, after "
        f"{timing.load_after[0]:.2f}; system part {sizes[0]['by_demo_max_steps']} tokens by demo_max_steps, "
        f"{sizes[0]['no_demonstration']} without the demonstration"
    )
    result = {
        **run_header(
            [".venv/bin/python", "-m", "benchmarks.prompt_cost"],
            argv if argv is not None else sys.argv[1:],
            load_average_at_start=load_at_start,
            load_average_before_timing=timing.load_before,
            load_average_after_timing=timing.load_after,
        ),
        "config": {
            "overrides": args.overrides,
            "tasks": cfg.replay_buffer.tasks,
            "simplification": ecfg.simplification,
            "max_steps": ecfg.max_steps,
            "max_model_len": cfg.policy_server.max_model_len,
            "prompt_token_budget": budget,
            "demonstration": acfg.demonstration,
            "demo_max_steps": acfg.demo_max_steps,
            "history_window": acfg.history_window,
            "max_action_tokens": acfg.max_action_tokens,
            "temperature": acfg.temperature,
            "stop_at_newline": acfg.stop_at_newline,
            "model": cfg.model.name,
            "policy_server": asdict(cfg.policy_server),
        },
        "variants": {
            "a": "reference prompt as configured",
            "b": "baseline: no demonstration, history_window=1 (action templates kept)",
        },
        "settings": {k: (repo_relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "episodes": [
            {
                "task": ep.task,
                **ctx,
                "turns": len(ep.states),
                "done": ep.done,
                "actions": ep.actions,
                "env_step_s_mean": float(np.mean(ep.env_step_s)),
            }
            for ep, ctx in zip(recording.episodes, recording.contexts)
        ],
        "system_part_tokens": sizes,
        "engine_start_s": timing.engine_start_s,
        "summary": parts,
        "per_turn": turns,
        "generations": [asdict(g) for g in gens],
        "wall_s": wall_s,
    }
    write_result(args.out, finite(result))


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer

    from actors.env_actor.prompts import PromptBuilder
    from common.model_prep import resolve_model
    from common.process import exit_on_sigterm

    args = parse_args(argv)
    exit_on_sigterm()  # SIGTERM runs the finally blocks of the steps like Ctrl-C does
    wall0, load_at_start = time.perf_counter(), os.getloadavg()
    cfg = load_config(args.overrides)
    acfg = cfg.env_actor
    steps = args.steps or cfg.env.max_steps
    lengths = [steps] * args.episodes + [args.long_steps] * (args.long_episodes if args.long_steps else 0)
    model_path = resolve_model(cfg.model.name, cfg.model.cache_dir or None)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    budget = acfg.prompt_budget(cfg.policy_server.max_model_len)
    builders = {"a": PromptBuilder(tokenizer, acfg.history_window, budget), "b": PromptBuilder(tokenizer, 1, budget)}
    print(
        f"[bench] tasks {cfg.replay_buffer.tasks}, episodes {lengths} turns, prompt budget {budget}, "
        f"(a) demonstration {acfg.demonstration} demo_max_steps {acfg.demo_max_steps} history_window "
        f"{acfg.history_window}; (b) no demonstration, history_window 1; load {load_at_start[0]:.2f}",
        flush=True,
    )
    recording = record_prompts(cfg, builders, tokenizer, lengths, steps, args)
    print(
        f"[bench] {len(recording.episodes)} episodes recorded in {recording.seconds:.1f} s; "
        f"{len(recording.prompts)} prompts built",
        flush=True,
    )
    timing = time_generations(cfg, model_path, tokenizer, recording)
    report(args, argv, cfg, budget, steps, recording, timing, wall0, load_at_start)


if __name__ == "__main__":
    main()
