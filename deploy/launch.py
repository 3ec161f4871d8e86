"""Launch the whole pipeline on this host, bounded by the learner's step count, then report.

Starts every role as its own OS process (own session, own log file under <run_dir>/logs):
policy servers, memory service, replay buffer, env actors, learner. Prints a progress line
every launch.progress_every_s from the processes' Prometheus endpoints, stops everything when
the learner finishes (or any process dies, or launch.timeout_s passes), and prints a summary.
Every `key=value` argument is a config override passed to every child as well.

Run: `empo2-run [key=value ...]`  (what `make run` does after set-up).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common.model_prep import resolve_model
from common.process import interrupt_on_sigterm, signal_group, spawn_role, wait_group
from deploy.monitor import scrape, total
from pipeline.cli import role_config
from pipeline.config import PipelineConfig


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def role_commands(cfg: PipelineConfig) -> list[tuple[str, list[str]]]:
    """(name, module argv) per process, in start order: servers first, learner last."""
    commands = [
        (f"policy_server{i}", ["actors.policy_server", f"policy_server.index={i}"])
        for i in range(len(cfg.endpoints.policy_servers))
    ]
    commands += [("memory_service", ["memory_service.service"]), ("replay_buffer", ["replay_buffer.service"])]
    commands += [
        (f"env_actor{j}", ["actors.env_actor", f"env_actor.index={j}"]) for j in range(cfg.launch.num_env_actors)
    ]
    # eval.every_steps: the periodic evaluation, its own process (never in the learner's way)
    commands += [("evaluator", ["evaluation.periodic"])] if cfg.eval.every_steps else []
    commands += [("learner", ["learner.train"])]  # last: Launcher.wait watches it
    return commands


class Launcher:
    def __init__(self, cfg: PipelineConfig, overrides: list[str], roles: list[tuple[str, list[str]]] | None = None):
        self.cfg, self.overrides = cfg, overrides
        self.roles = role_commands(cfg) if roles is None else roles  # a subset for other tools (TTA)
        self.children: list[Child] = []
        self.log_dir = Path(cfg.run_dir) / "logs"

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name, (module, *role_args) in self.roles:
            log_path = self.log_dir / f"{name}.log"
            process = spawn_role(module, [*self.overrides, *role_args], log_path)
            self.children.append(Child(name, process, log_path))
            print(f"[launch] started {name} (pid {process.pid}), log {log_path}", flush=True)

    def check_alive(self) -> None:
        """RuntimeError naming the first started process that has exited, with its log's last
        lines: a tool waiting on the processes fails at once instead of at its deadline."""
        for child in self.children:
            if child.process.poll() is not None:
                raise RuntimeError(
                    f"{child.name} exited with {child.process.returncode}; "
                    f"last lines of {child.log_path}:\n{child.tail()}"
                )

    def progress(self) -> dict[str, float]:
        m, host = self.cfg.metrics, self.cfg.metrics.host
        learner = scrape(host, m.port("learner"))
        buffer = scrape(host, m.port("replay_buffer"))
        memory = scrape(host, m.port("memory_service"))
        servers = [scrape(host, m.port("policy_server", i)) for i in range(len(self.cfg.endpoints.policy_servers))]
        actors = [scrape(host, m.port("env_actor", j)) for j in range(self.cfg.launch.num_env_actors)]
        return {
            "learner_steps": total(learner, "empo2_learner_steps_total"),
            "episodes": total(buffer, "empo2_replay_buffer_trajectories_accepted_total"),
            "groups_ready": total(buffer, "empo2_replay_buffer_groups_ready"),
            "memory_entries": total(memory, "empo2_memory_service_entries"),
            "reflections": total(memory, "empo2_memory_service_reflections_total"),
            "server_versions": [s.get("empo2_policy_server_policy_version", -1) for s in servers],
            "servers_ready": sum(s.get("empo2_policy_server_ready", 0) for s in servers),
            "generated_tokens": sum(total(s, "empo2_policy_server_generated_tokens_total") for s in servers),
            "memories_retrieved": total(memory, "empo2_memory_service_retrieval_hits_sum"),
            "tips_shown": sum(total(a, "empo2_env_actor_tips_shown_total") for a in actors),
            "memory_fallbacks": sum(total(a, "empo2_env_actor_memory_fallbacks_total") for a in actors),
            "env_steps": sum(total(a, "empo2_env_actor_env_steps_total") for a in actors),
        }

    def wait(self) -> str:
        """Block until the learner exits ('done'), a process dies ('failed: ...') or time runs out."""
        learner = self.children[-1]
        deadline = time.monotonic() + self.cfg.launch.timeout_s
        t0 = time.monotonic()
        next_report = t0
        while True:
            if learner.process.poll() is not None:
                return (
                    "done"
                    if learner.process.returncode == 0
                    else f"failed: learner exited with {learner.process.returncode}"
                )
            for child in self.children[:-1]:
                if child.process.poll() is not None:
                    return f"failed: {child.name} exited with {child.process.returncode}"
            if time.monotonic() > deadline:
                return f"failed: timeout after {self.cfg.launch.timeout_s:.0f}s"
            if time.monotonic() >= next_report:
                p = self.progress()
                print(
                    f"[launch] {time.monotonic() - t0:6.0f}s  servers ready {p['servers_ready']:.0f}, versions {p['server_versions']}  "
                    f"episodes {p['episodes']:.0f}  learner steps {p['learner_steps']:.0f}/{self.cfg.learner.total_steps}  "
                    f"memory entries {p['memory_entries']:.0f}  tokens generated {p['generated_tokens']:.0f}",
                    flush=True,
                )
                next_report += self.cfg.launch.progress_every_s
            time.sleep(1.0)

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.process.poll() is None:
                signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.launch.stop_grace_s
        for child in self.children:
            wait_group(child.process, deadline)
            signal_group(child.process, signal.SIGKILL)  # what is left of the group after the grace period
            child.process.wait()


def main(argv: list[str] | None = None, cfg: PipelineConfig | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = cfg or role_config("empo2-run", argv)
    t0 = time.time()
    print(f"[launch] run dir {cfg.run_dir}; preparing model {cfg.model.name}", flush=True)
    print(f"[launch] model at {resolve_model(cfg.model.name, cfg.model.cache_dir or None)}", flush=True)
    launcher = Launcher(cfg, [*argv, f"run_dir={cfg.run_dir}"])  # children share one (resolved) run dir
    outcome = "failed: interrupted"
    interrupt_on_sigterm()  # `kill`, systemd and test clean-ups stop the roles too, not only Ctrl-C
    try:
        launcher.start()
        outcome = launcher.wait()
        final = launcher.progress()
    except KeyboardInterrupt:
        final = launcher.progress()
    finally:
        launcher.stop()
    summary_path = Path(cfg.run_dir) / "learner_summary.json"
    learner = json.loads(summary_path.read_text()) if outcome == "done" and summary_path.exists() else {}
    history = learner.get("history", [])
    summary = {
        "outcome": outcome,
        "wall_seconds": round(time.time() - t0, 1),
        "learner_steps": learner.get("steps", final["learner_steps"]),
        "policy_version": learner.get("policy_version"),
        "server_versions_at_end": final["server_versions"],
        "episodes": final["episodes"],
        "env_steps": final["env_steps"],
        "memory_entries": final["memory_entries"],
        "reflections": final["reflections"],
        "memories_retrieved": final["memories_retrieved"],
        "tips_shown": final["tips_shown"],
        "memory_fallbacks": final["memory_fallbacks"],
        "weight_push_seconds": [round(h["weight_push_seconds"], 2) for h in history],
        "step_seconds": [round(h["step_seconds"], 1) for h in history],
        "mean_episode_score": (
            sum(h["episode_score_mean"] * h["episodes"] for h in history) / max(sum(h["episodes"] for h in history), 1)
        )
        if history
        else None,
        "final_checkpoint": learner.get("final_checkpoint"),
        "logs": str(launcher.log_dir),
        "run_dir": cfg.run_dir,
    }
    Path(cfg.run_dir, "summary.json").write_text(json.dumps(summary, indent=1))
    print("[launch] summary:\n" + "\n".join(f"  {k}: {v}" for k, v in summary.items()), flush=True)
    if outcome != "done":
        for child in launcher.children:
            if child.process.returncode not in (0, -signal.SIGTERM, None) or child.name in outcome:
                print(f"[launch] --- last lines of {child.log_path} ---\n{child.tail()}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
