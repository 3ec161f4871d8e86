"""SPA's self-play collection: the base policy plays the training variations of replay_buffer.tasks
(never a test variation) in the world-model turn format (actors/env_actor/turn_format.py: its estimate
of the state, its reasoning, its prediction of the next state, the action in <answer>), through the env
actors' own client API, at spa.temperature, at most spa.max_turns turns. Each finished episode is one
line of <run_dir>/spa/episodes.jsonl, appended as it ends: a rerun plays only the episodes not in it.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from actors.env_actor.episode import Episode
from actors.env_actor.process import EnvActor
from actors.env_actor.turn_format import world_model
from deploy.launch import Launcher
from evaluation.config import FIXED_WEIGHTS
from pipeline.config import PipelineConfig, run_facts
from pipeline.roles import run_roles
from protocol.messages import ON_POLICY, Assignment
from spa.states import states_of

EPISODES_FILE = "episodes.jsonl"


def spa_dir(cfg: PipelineConfig) -> Path:
    path = Path(cfg.run_dir) / "spa"
    path.mkdir(parents=True, exist_ok=True)
    return path


def plan(tasks: list[str], train_variations: dict[str, list[int]], episodes: int) -> list[Assignment]:
    """`episodes` episodes over the tasks' training variations in turn, seed k for the k-th."""
    out = []
    for k in range(episodes):
        task = tasks[k % len(tasks)]
        variations = train_variations[task]
        variation = variations[(k // len(tasks)) % len(variations)]
        out.append(Assignment(group_id=f"spa-{k}", slot=0, task=task, variation=variation, mode=ON_POLICY, seed=k))
    return out


def read_episodes(path: Path) -> dict[int, dict]:
    """The collected episodes by seed; a line cut by an interruption is ignored."""
    found = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            found[record["seed"]] = record
    return found


def episode_record(assignment: Assignment, episode: Episode, runner) -> dict:
    """One collected episode: what the SFT rows are built from (spa/states.py)."""
    t, stats = episode.trajectory, episode.stats
    demo, templates = runner.prompt_parts(t.task, t.variation)  # cached per task: the one it was played with
    states = states_of(t.observations, t.locations, t.inventories, t.start_inventory, stats.feedbacks)
    return {
        "seed": assignment.seed,
        "task": t.task,
        "variation": t.variation,
        "score": t.score,
        "task_description": episode.task_description,
        "demonstration": None
        if demo is None
        else {"variation": demo.variation, "task_description": demo.task_description, "actions": demo.actions},
        "action_templates": templates,
        "turns": [
            {"state": state, "note": note, "response": text, "action": action, "current": current, "next": next_}
            for state, note, text, action, (current, next_) in zip(
                t.observations, stats.notes, t.generated_texts, t.actions, states
            )
        ],
    }


def collect(cfg: PipelineConfig, overrides: list[str]) -> Path:
    """Play what is missing of the plan; returns the episodes file."""
    spa = cfg.spa
    out = spa_dir(cfg) / EPISODES_FILE
    play_cfg = copy.deepcopy(cfg)
    play_cfg.env.max_steps, play_cfg.env.task_step_limits = spa.max_turns, False
    play_cfg.env_actor.envs_per_actor = spa.envs
    roles = [r for r in run_roles(cfg) if r[0].startswith("policy_server")]
    launcher = Launcher(cfg, [*overrides, *FIXED_WEIGHTS, f"run_dir={cfg.run_dir}"], roles=roles)
    launcher.log_dir = spa_dir(cfg) / "logs"
    lock = threading.Lock()
    with ExitStack() as cleanup:
        cleanup.callback(launcher.stop)
        pool = EnvActor(
            play_cfg.env_actor, play_cfg.env, run_facts(play_cfg), turn_format=world_model(spa.max_turn_tokens)
        )
        cleanup.callback(pool.close)
        env = pool.workers[0].env
        tasks = cfg.replay_buffer.tasks
        train = {t: env.train_variations(t)[: cfg.replay_buffer.variations_per_task] for t in tasks}  # the RL's
        assignments = plan(tasks, train, spa.episodes)
        done = read_episodes(out)
        todo = [a for a in assignments if a.seed not in done]
        print(
            f"[spa collect] {len(assignments)} episodes on the training variations of {', '.join(tasks)}, "
            f"{len(assignments) - len(todo)} already in {out}, {len(todo)} to play on {spa.envs} envs "
            f"at temperature {spa.temperature}, at most {spa.max_turns} turns of {spa.max_turn_tokens} tokens",
            flush=True,
        )
        if not todo:
            return out
        launcher.start()
        pool.open()
        pool.wait_ready(buffer=False, memory=False, on_wait=lambda _endpoint, _left: launcher.check_alive())
        started, finished = time.monotonic(), [0]

        def record(i: int, episode: Episode) -> None:
            worker = next(w for w in pool.workers if w.actor_id == episode.trajectory.actor_id)
            line = json.dumps(episode_record(todo[i], episode, worker.runner)) + "\n"
            with lock, open(out, "a") as f:
                f.write(line)
                finished[0] += 1
                elapsed = time.monotonic() - started
                eta = elapsed / finished[0] * (len(todo) - finished[0])
                print(
                    f"[spa collect] {len(assignments) - len(todo) + finished[0]}/{len(assignments)} "
                    f"elapsed {elapsed:.0f}s ETA {eta:.0f}s  {episode.trajectory.task} v{episode.trajectory.variation}: "
                    f"score {episode.trajectory.score:.0f}, {episode.trajectory.num_turns} turns",
                    flush=True,
                )

        pool.play_all(todo, spa.temperature, on_episode=record)
    return out
