"""Launch the whole pipeline on this host and supervise it, bounded by the learner's step count.

Starts every role as its own OS process (own session, own log file under <run_dir>/logs):
policy servers, memory service, replay buffer, env actors, learner (the role table,
pipeline/roles.py, run_roles). A role that exits is started again after a backoff (launch.backoff_s, doubling,
at most launch.backoff_max_s): the learner resumes from its newest checkpoint, the replay buffer
replays its log, the memory service reopens its database. Each restart is printed and counted
(empo2_launch_restarts_total{role,reason}); a role restarted more than launch.restart_budget times
within launch.restart_window_s stops the run with its name, exit status and last log lines.
A role that makes no progress is restarted too: its heartbeat file (<run_dir>/heartbeats/<name>,
touched by its own work loop, common/heartbeat.py) still for launch.hang_timeout_s gets its group
SIGKILLed, and the restart is counted with reason `hung` (empo2_launch_restarts_total{role,reason},
the log line, the state file's restart_reasons).
The run ends when the learner exits 0 (or launch.timeout_s passes), and a summary is printed.

While it runs the launcher serves its own metrics on metrics.port("launch") and keeps
<run_dir>/launch/state.json (pids, restarts) and <run_dir>/prometheus/targets.json (Prometheus
file-based discovery) current (deploy/run_state.py). A progress line every
launch.progress_every_s comes from the processes' Prometheus endpoints. Every `key=value`
argument is a config override passed to every child as well.

Where each role runs is its Placement: here, by default; deploy/slurm.py's places each on a node of
a Slurm allocation (a job step), with the same supervision.

Scaling while it runs: `empo2-run --attach RUN_DIR launch.num_env_actors=N` asks this launcher
(through <run_dir>/launch/scale.json) to run N env actors: new ones start at once and get
assignments from the buffer; the ones over N are stopped gracefully and return their unfinished
slots. The learner, buffer and memory service are not touched.

Run: `empo2-run [key=value ...]`  (what `make run` does after set-up).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.config import ConfigError
from common.heartbeat import heartbeat_path, last_beat
from common.metrics import (
    ENV_ACTOR_ENV_STEPS,
    ENV_ACTOR_MEMORY_FALLBACKS,
    ENV_ACTOR_TIP_TURNS,
    ENV_ACTOR_TIPS_SHOWN,
    ENV_ACTOR_TURNS,
    LEARNER_STEPS,
    MEMORY_SERVICE_ENTRIES,
    MEMORY_SERVICE_REFLECTIONS,
    MEMORY_SERVICE_RETRIEVAL_HITS,
    POLICY_SERVER_GENERATED_TOKENS,
    POLICY_SERVER_POLICY_VERSION,
    POLICY_SERVER_READY,
    REPLAY_BUFFER_GROUPS_READY,
    REPLAY_BUFFER_TRAJECTORIES_ACCEPTED,
    LaunchMetrics,
)
from common.model_prep import prepare_model
from common.process import (
    group_shm_files,
    interrupt_on_sigterm,
    orphaned_semaphores,
    signal_group,
    signal_leader,
    spawn_role,
    unlink_unmapped,
    wait_group,
)
from common.tracking import CONFIG_FILE, Tracker, run_config_record
from deploy.monitor import scrape, total
from deploy.run_state import (
    STATE_FILE,
    TARGETS_FILE,
    mark_finished,
    read_scale_request,
    read_state,
    request_scale,
    scrape_targets,
    write_json,
)
from pipeline.config import PipelineConfig, load_config, to_dict
from pipeline.roles import LEARNER_TOKEN_ENV, RoleSpec, env_actor_spec, run_roles
from protocol.messages import TIP_MODES

# How long `--attach` waits for the launcher to apply a scale request (a scaled-down actor may take
# launch.stop_grace_s to stop).
ATTACH_TIMEOUT_S = 120.0


# The launcher's line in a role's log when it stops the role at the end of a run (SIGTERM to the
# role, SIGKILL to what is left of its group after the grace period): a clean stop writes no traceback or leaked-resource warning after it.
STOPPING = "stopping: SIGTERM (then its process group is given launch.stop_grace_s to exit)"


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path
    spec: RoleSpec | None = None
    restart_times: list[float] = field(default_factory=list)  # time.monotonic() of each restart
    restart_at: float | None = None  # set while the role waits out its backoff
    last_exit: int | None = None  # of the last process that exited while the run went on (restarted)
    stop_by: float | None = None  # scaled down: SIGTERM sent, SIGKILL after this; not restarted
    started_at: float = field(default_factory=time.time)  # wall clock, as the heartbeat's mtime
    reason: str = "exit"  # why it is down: "exit" (it exited) or "hung" (killed: no heartbeat)
    restart_reasons: dict[str, int] = field(default_factory=dict)  # reason -> restarts
    final_exit: int | None = None  # of its process when the launcher stopped (0: a clean stop; -9: killed)

    @property
    def restarts(self) -> int:
        return sum(self.restart_reasons.values())

    def note(self, line: str) -> None:
        """A line of the launcher's in the role's log (appended, as the role writes it)."""
        with open(self.log_path, "a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {self.name} [launch] {line}\n")

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Placement:
    """Where the launcher starts each role: on this host (no command prefix), its metrics at
    metrics.host. A scheduler's placement (deploy/slurm.py) overrides both: the host a role of
    `kind` and `index` runs on, and the command that execs the role there."""

    def host(self, kind: str, index: int, default: str) -> str:
        return default

    def exec_prefix(self, spec: RoleSpec) -> tuple[str, ...]:
        return ()

    def terminate(self, process: subprocess.Popen, spec: RoleSpec, group: bool = False) -> None:
        """Ask a role to stop (SIGTERM): the role alone, which stops its own children in order, or
        its whole process group. SIGKILL, where the launcher gives up on a role, is always the group's."""
        (signal_group if group else signal_leader)(process, signal.SIGTERM)


class Launcher:
    """Starts role processes and, in wait(), supervises them. `publish`: this is a run's launcher,
    so it serves its metrics and writes the state and scrape-target files (tools that start a
    subset of roles for themselves, TTA and the benchmarks, do not)."""

    def __init__(
        self,
        cfg: PipelineConfig,
        overrides: list[str],
        roles: list[RoleSpec] | None = None,
        publish: bool = False,
        placement: Placement | None = None,
    ):
        self.cfg, self.overrides, self.publish = cfg, overrides, publish
        self.placement = placement or Placement()
        # a run's own learner token when the config sets none: only its learner takes batches
        self.learner_token = "" if cfg.security.learner_token or not publish else secrets.token_urlsafe(24)
        self.roles = run_roles(cfg) if roles is None else roles  # a subset for other tools (TTA)
        self.children: list[Child] = []
        self.log_dir = Path(cfg.run_dir) / "logs"
        self.metrics = LaunchMetrics()
        self.scale_request: int | None = None  # the last launch/scale.json applied
        self.tracker: Tracker | None = None  # tracking.backends (common/tracking.py); main opens it

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.publish:
            self.metrics.serve(self.cfg.metrics.host, self.cfg.metrics.port("launch"))
        for spec in self.roles:
            child = Child(spec.name, self._spawn(spec), self.log_dir / f"{spec.name}.log", spec)
            self.children.append(child)
            self.metrics.role_up.labels(spec.name).set(1)
            print(f"[launch] started {spec.name} (pid {child.process.pid}), log {child.log_path}", flush=True)
        self.write_state()

    def _spawn(self, spec: RoleSpec) -> subprocess.Popen:
        module, *command = spec.argv
        token = {LEARNER_TOKEN_ENV: self.learner_token} if self.learner_token and spec.learner_token else {}
        args = [*command, *self.overrides, *spec.args]
        log_path = self.log_dir / f"{spec.name}.log"
        return spawn_role(module, args, log_path, env_extra=token, exec_prefix=self.placement.exec_prefix(spec))

    def metrics_address(self, kind: str, index: int = 0) -> tuple[str, int]:
        """(host, port) of the /metrics page of the role of `kind` and `index`, where it runs."""
        m = self.cfg.metrics
        return self.placement.host(kind, index, m.host), m.port(kind, index)

    def check_alive(self) -> None:
        """RuntimeError naming the first started process that has exited, with its log's last
        lines: a tool waiting on the processes fails at once instead of at its deadline."""
        for child in self.children:
            if child.process.poll() is not None:
                raise RuntimeError(
                    f"{child.name} exited with {child.process.returncode}; "
                    f"last lines of {child.log_path}:\n{child.tail()}"
                )

    def supervise(self, now: float) -> str | None:
        """One supervision pass: restart roles whose backoff is over, schedule a restart for each
        role that exited. 'done' when a run-ending role (the learner) exited 0, 'failed: ...'
        when a role has spent its restart budget; None while the run goes on."""
        launch = self.cfg.launch
        changed = False
        for child in list(self.children):
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._restart(child, now)
                    changed = True
                continue
            rc = child.process.poll()
            if child.stop_by is not None:  # scaled down: gone for good once its group has exited
                if rc is None and now > child.stop_by:
                    signal_group(child.process, signal.SIGKILL)
                if rc is not None and wait_group(child.process, now):
                    print(f"[launch] {child.name} stopped (exit status {rc}): scaled down", flush=True)
                    self.metrics.role_up.labels(child.name).set(0)
                    self.children.remove(child)
                    changed = True
                continue
            reason, silent = "exit", None
            if rc is None:
                silent = self.silence(child)
                if silent is None:
                    continue
                reason = "hung"
            elif child.spec is not None and child.spec.ends_run and rc == 0:
                return "done"
            # what a crash leaves of the role's group (its JVM, a vLLM engine core) would hold
            # its ports and memory: gone before the role starts again, with the shared memory
            # its engine mapped and the semaphores of its dead processes (the resource trackers that
            # would unlink them died with the role)
            leftover_shm = group_shm_files(child.process)
            signal_group(child.process, signal.SIGKILL)  # also a SIGSTOPped group
            wait_group(child.process, now + launch.stop_grace_s)
            for path in unlink_unmapped(leftover_shm | orphaned_semaphores()):
                print(f"[launch] {child.name}: removed its leftover {path}", flush=True)
            if rc is None:  # a hung one, killed just now
                rc = -signal.SIGKILL if child.process.returncode is None else child.process.returncode
            what = (
                f"hung: no progress for {silent:.0f}s (launch.hang_timeout_s={launch.hang_timeout_s:.0f}), killed"
                if reason == "hung"
                else f"exited with {rc}"
            )
            child.last_exit, child.reason = rc, reason
            self.metrics.role_up.labels(child.name).set(0)
            self.metrics.last_exit_code.labels(child.name).set(rc)
            changed = True
            recent = [t for t in child.restart_times if now - t < launch.restart_window_s]
            if len(recent) >= launch.restart_budget:
                self.write_state()
                return (
                    f"failed: {child.name} {what}; restart budget spent "
                    f"({len(recent)} restarts within launch.restart_window_s={launch.restart_window_s:.0f}s, "
                    f"launch.restart_budget={launch.restart_budget})"
                )
            delay = min(launch.backoff_s * 2 ** len(recent), launch.backoff_max_s)
            child.restart_at = now + delay
            print(
                f"[launch] {child.name} (pid {child.process.pid}) {what}; restarting in {delay:.1f}s "
                f"(restart {child.restarts + 1}, reason {reason}, {len(recent)} within {launch.restart_window_s:.0f}s)",
                flush=True,
            )
        if changed:
            self.write_state()
        return None

    def silence(self, child: Child) -> float | None:
        """Seconds `child` has made no progress, once past its limit (None while within it, for a
        role without a heartbeat, and with launch.hang_timeout_s=0): since its last beat, or
        since its start until its first beat, which may take max(hang_timeout_s, startup_timeout_s)."""
        hang_s = self.cfg.launch.hang_timeout_s
        if not hang_s or child.spec is None or not child.spec.heartbeat:
            return None
        beat = last_beat(heartbeat_path(self.cfg.run_dir, child.name))
        if beat is not None and beat >= child.started_at:  # a beat of this process, not of the last one
            since, limit = beat, hang_s
        else:
            since, limit = child.started_at, max(hang_s, self.cfg.startup_timeout_s)
        silent = time.time() - since
        return silent if silent > limit else None

    def scale_env_actors(self, count: int, now: float) -> None:
        """Run `count` env actors: start the missing ones at once (the lowest free indices), stop
        the ones over it gracefully (SIGTERM: they return their unfinished slots to the buffer)."""
        actors = [c for c in self.children if c.spec.kind == "env_actor" and c.stop_by is None]
        for child in sorted(actors, key=lambda c: c.spec.index, reverse=True)[: max(len(actors) - count, 0)]:
            print(f"[launch] scaling down: stopping {child.name} (pid {child.process.pid})", flush=True)
            self.placement.terminate(child.process, child.spec, group=True)
            child.stop_by = now + self.cfg.launch.stop_grace_s
            child.restart_at = None
        taken = {c.spec.index for c in self.children if c.spec.kind == "env_actor"}
        free = (j for j in range(len(taken) + count) if j not in taken)
        for _ in range(count - len(actors)):
            spec = env_actor_spec(next(free))
            child = Child(spec.name, self._spawn(spec), self.log_dir / f"{spec.name}.log", spec)
            self.children.append(child)
            self.metrics.role_up.labels(spec.name).set(1)
            print(f"[launch] scaling up: started {spec.name} (pid {child.process.pid})", flush=True)
        self.write_state()

    def follow_scale_request(self, now: float) -> None:
        """Apply <run_dir>/launch/scale.json when `empo2-run --attach` has written a new one."""
        request = read_scale_request(self.cfg.run_dir) if self.publish else None
        if request is not None and request != self.scale_request:
            self.scale_request = request
            self.scale_env_actors(request, now)

    def _restart(self, child: Child, now: float) -> None:
        child.started_at = time.time()
        child.process = self._spawn(child.spec)
        child.restart_at = None
        child.restart_times.append(now)
        child.restart_reasons[child.reason] = child.restart_reasons.get(child.reason, 0) + 1
        self.metrics.restarts.labels(child.name, child.reason).inc()
        self.metrics.role_up.labels(child.name).set(1)
        print(
            f"[launch] restarted {child.name} (pid {child.process.pid}), restart {child.restarts}, reason {child.reason}",
            flush=True,
        )

    def write_state(self) -> None:
        if not self.publish:
            return
        roles = [
            {
                "name": c.name,
                "kind": c.spec.kind,
                "index": c.spec.index,
                "pid": c.process.pid,
                "up": c.restart_at is None and c.process.poll() is None,
                "restarts": c.restarts,
                "restart_reasons": c.restart_reasons,  # {"exit": n, "hung": m}
                "last_exit": c.last_exit,
                "exit": c.final_exit,
                "metrics": "{}:{}".format(*self.metrics_address(c.spec.kind, c.spec.index)),
                "log": str(c.log_path),
            }
            for c in self.children
        ]
        launcher_target = "{}:{}".format(*self.metrics_address("launch"))
        run_dir = Path(self.cfg.run_dir)
        write_json(run_dir / TARGETS_FILE, scrape_targets(roles, launcher_target))
        write_json(
            run_dir / STATE_FILE,
            {"launcher_pid": os.getpid(), "metrics": launcher_target, "roles": {r["name"]: r for r in roles}},
        )

    def restarts(self) -> dict[str, int]:
        return {c.name: c.restarts for c in self.children}

    def progress(self) -> dict:
        """The run's counts from the roles' metrics, as integers (a role not answering counts 0; a
        server not answering has version -1)."""
        at = self.metrics_address
        learner, buffer, memory = scrape(*at("learner")), scrape(*at("replay_buffer")), scrape(*at("memory_service"))
        servers = [scrape(*at("policy_server", i)) for i in range(len(self.cfg.endpoints.policy_servers))]
        actors = [scrape(*at("env_actor", c.spec.index)) for c in self.children if c.spec.kind == "env_actor"]
        counts = {
            "learner_steps": total(learner, LEARNER_STEPS),
            "episodes": total(buffer, REPLAY_BUFFER_TRAJECTORIES_ACCEPTED),
            "groups_ready": total(buffer, REPLAY_BUFFER_GROUPS_READY),
            "memory_entries": total(memory, MEMORY_SERVICE_ENTRIES),
            "reflections": total(memory, MEMORY_SERVICE_REFLECTIONS),
            "server_versions": [s.get(POLICY_SERVER_POLICY_VERSION, -1) for s in servers],
            "servers_ready": sum(s.get(POLICY_SERVER_READY, 0) for s in servers),
            "generated_tokens": sum(total(s, POLICY_SERVER_GENERATED_TOKENS) for s in servers),
            "memories_retrieved": total(memory, f"{MEMORY_SERVICE_RETRIEVAL_HITS}_sum"),
            "tips_shown": sum(total(a, ENV_ACTOR_TIPS_SHOWN) for a in actors),
            "tip_turns": sum(total(a, ENV_ACTOR_TIP_TURNS) for a in actors),
            "turns": sum(total(a, ENV_ACTOR_TURNS) for a in actors),
            "memory_fallbacks": sum(total(a, ENV_ACTOR_MEMORY_FALLBACKS) for a in actors),
            "env_steps": sum(total(a, ENV_ACTOR_ENV_STEPS) for a in actors),
        }
        # every one a count: episodes 9 and versions [-1], not 9.0 and [-1.0] (Prometheus' floats)
        return {k: [int(x) for x in v] if isinstance(v, list) else int(v) for k, v in counts.items()}

    def wait(self) -> str:
        """Supervise until the learner exits 0 ('done'), a role spends its restart budget or time
        runs out ('failed: ...')."""
        deadline = time.monotonic() + self.cfg.launch.timeout_s
        t0 = time.monotonic()
        next_report = t0
        rate = StepRate()
        while True:
            self.follow_scale_request(time.monotonic())
            outcome = self.supervise(time.monotonic())
            if outcome is not None:
                return outcome
            if time.monotonic() > deadline:
                return f"failed: timeout after {self.cfg.launch.timeout_s:.0f}s"
            if time.monotonic() >= next_report:
                p, now = self.progress(), time.monotonic()
                eta = rate.eta_s(now, p["learner_steps"], self.cfg.learner.total_steps)
                line = progress_line(now - t0, p, self.cfg.learner.total_steps, eta, sum(self.restarts().values()))
                print(line, flush=True)
                self.track(p)
                next_report += self.cfg.launch.progress_every_s
            time.sleep(0.5)

    def track(self, progress: dict | None = None) -> None:
        """The metrics log's new records, and the rollout counts just read, to the trackers. A tracker that
        fails mid-run is reported on the console and the run goes on: training outranks its charts."""
        if self.tracker is None:
            return
        try:
            self.tracker.follow()
            if progress is not None:
                self.tracker.rollout(progress["learner_steps"], progress)
        except Exception as e:  # whatever the backend raises (a locked store, a full disk, a server gone)
            self.metrics.tracking_failures.inc()
            print(f"[launch] tracking failed ({type(e).__name__}: {e}); the run goes on", flush=True)

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.process.poll() is None:
                child.note(STOPPING)  # what follows in its log is its stop
                self.placement.terminate(child.process, child.spec)  # it stops its own children in order
        deadline = time.monotonic() + self.cfg.launch.stop_grace_s
        for child in self.children:
            wait_group(child.process, deadline)
            signal_group(child.process, signal.SIGKILL)  # what is left of the group after the grace period
            child.final_exit = child.process.wait()
            self.metrics.role_up.labels(child.name).set(0)
        for path in unlink_unmapped(orphaned_semaphores()):  # of a group killed after its grace period
            print(f"[launch] removed the leftover {path}", flush=True)
        self.write_state()
        self.metrics.close()


class StepRate:
    """The learner's pace as the launcher sees it, for the progress line's ETA: measured from the
    first step seen taken (so the start-up, the model load and the first batch's rollouts are not in
    it; a resumed run counts from its own first step) to the newest."""

    def __init__(self) -> None:
        self.first: int | None = None  # the step count at the first look
        self.start: tuple[float, int] | None = None  # (time, steps) when a step was first seen taken

    def eta_s(self, now: float, steps: int, total_steps: int) -> float | None:
        """Seconds until total_steps at the rate so far; None until two steps were seen taken."""
        if self.first is None:
            self.first = steps
        if self.start is None and steps > self.first:
            self.start = (now, steps)
        if steps >= total_steps:
            return 0.0
        if self.start is None or steps <= self.start[1]:
            return None
        return (total_steps - steps) * (now - self.start[0]) / (steps - self.start[1])


def duration(seconds: float) -> str:
    """4h05m, 12m30s, 45s."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def progress_line(elapsed: float, p: dict, total_steps: int, eta: float | None, restarts: int) -> str:
    """The line empo2-run prints every launch.progress_every_s (15 s): counts as integers, and the
    ETA of the learner's last step at its rate so far (StepRate; "ETA --" until it has one)."""
    eta_text = "--" if eta is None else duration(eta)
    return (
        f"[launch] {elapsed:6.0f}s  servers ready {p['servers_ready']}, versions {p['server_versions']}  "
        f"episodes {p['episodes']}  learner steps {p['learner_steps']}/{total_steps} (ETA {eta_text})  "
        f"memory entries {p['memory_entries']}  tokens generated {p['generated_tokens']}  restarts {restarts}"
    )


def tips_note(final: dict, history: list[dict], p_memory: float) -> str:
    """Why the run showed the tips it did, in a line: when none, the first reason that holds (no memory
    in the method, no group drawn in a tip mode, the memory unreachable, an empty memory or none close
    enough to the states played)."""
    drawn = sum(n for h in history for mode, n in h.get("episodes_by_mode", {}).items() if mode in TIP_MODES)
    episodes = sum(h.get("episodes", 0) for h in history)
    if final["tips_shown"]:
        return (
            f"{final['tip_turns']:.0f} turns showed tips, in {drawn} of {episodes} trained episodes drawn in a tip mode"
        )
    if p_memory == 0:
        return "none: replay_buffer.p_memory is 0 (the method uses no memory)"
    if history and not drawn:
        return (
            f"none: no group was drawn in a tip mode (replay_buffer.p_memory={p_memory:g}; "
            f"{episodes} trained episodes, all on-policy)"
        )
    if final["memory_fallbacks"]:
        return f"none: the memory service did not answer ({final['memory_fallbacks']:.0f} turns went without)"
    if not final["memory_entries"]:
        return "none: the memory was empty whenever a tip-mode episode retrieved (no reflection stored yet)"
    return (
        "none: no stored state was close enough to the states played "
        "(memory_service.similarity_threshold, memory_service.state_key)"
    )


def attach_main(argv: list[str]) -> int:
    """`empo2-run --attach RUN_DIR launch.num_env_actors=N`: ask the launcher running RUN_DIR to
    run N env actors (<run_dir>/launch/scale.json), wait until it does, exit 0. New actors get
    assignments at once; the ones over N stop gracefully and return their unfinished slots."""
    if len(argv) != 2 or not argv[1].startswith("launch.num_env_actors="):
        print("usage: empo2-run --attach RUN_DIR launch.num_env_actors=N", file=sys.stderr)
        return 2
    run_dir, override = argv
    try:
        count = load_config([f"run_dir={run_dir}", override]).launch.num_env_actors
    except ConfigError as exc:
        print(f"empo2-run --attach: bad configuration: {exc}", file=sys.stderr)
        return 2
    state = read_state(run_dir)
    try:
        os.kill(state["launcher_pid"], 0)
    except (KeyError, ProcessLookupError):
        print(f"empo2-run --attach: no launcher is running {run_dir}", file=sys.stderr)
        return 2
    request_scale(run_dir, count)
    print(f"[attach] asked the launcher of {run_dir} (pid {state['launcher_pid']}) for {count} env actors", flush=True)
    deadline = time.monotonic() + ATTACH_TIMEOUT_S
    while True:
        actors = [r for r in read_state(run_dir)["roles"].values() if r["kind"] == "env_actor"]
        up = sorted(r["name"] for r in actors if r["up"])
        if len(actors) == len(up) == count:  # the ones scaled down have left the state
            break
        if time.monotonic() > deadline:
            print(f"[attach] not applied after {ATTACH_TIMEOUT_S:.0f}s: env actors up {up}", file=sys.stderr)
            return 1
        time.sleep(0.5)
    print(f"[attach] running env actors: {', '.join(up)}", flush=True)
    return 0


def main(argv: list[str], cfg: PipelineConfig, placement: Placement | None = None) -> int:
    """A run: its roles started where `placement` says (here by default), supervised to the end."""
    t0 = time.time()
    print(f"[launch] run dir {cfg.run_dir}; preparing model {cfg.model.name}", flush=True)
    try:
        print(f"[launch] model at {prepare_model(cfg.model.name, cfg.model.cache_dir or None)}", flush=True)
    except RuntimeError as exc:  # a hub model neither cached nor fetchable here: refused before any role starts
        print(f"empo2-run: {exc}", file=sys.stderr)
        return 2
    # children share one (resolved) run dir
    launcher = Launcher(cfg, [*argv, f"run_dir={cfg.run_dir}"], publish=True, placement=placement)
    write_json(Path(cfg.run_dir) / CONFIG_FILE, run_config_record(to_dict(cfg), argv))
    if cfg.tracking.backends:  # opened before any role starts: a backend that cannot open refuses the run
        try:
            launcher.tracker = Tracker(cfg.tracking, cfg.run_dir)
        except ConfigError as exc:
            print(f"empo2-run: {exc}", file=sys.stderr)
            return 2
        print(f"[launch] tracking to {', '.join(cfg.tracking.backends)} in {launcher.tracker.out}", flush=True)
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
        launcher.track()  # the last steps and the final evaluation's records
        if launcher.tracker is not None:
            launcher.tracker.close()
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
        "tip_turns": f"{final['tip_turns']:.0f} of {final['turns']:.0f} turns",
        "tips_note": tips_note(final, history, cfg.replay_buffer.p_memory),
        "memory_fallbacks": final["memory_fallbacks"],
        "weight_push_seconds": [round(h["weight_push_seconds"], 2) for h in history],
        "step_seconds": [round(h["step_seconds"], 1) for h in history],
        "mean_episode_score": (
            sum(h["episode_score_mean"] * h["episodes"] for h in history) / max(sum(h["episodes"] for h in history), 1)
        )
        if history
        else None,
        "final_checkpoint": learner.get("final_checkpoint"),
        "restarts": launcher.restarts(),
        "logs": str(launcher.log_dir),
        "run_dir": cfg.run_dir,
    }
    Path(cfg.run_dir, "summary.json").write_text(json.dumps(summary, indent=1))
    print("[launch] summary:\n" + "\n".join(f"  {k}: {v}" for k, v in summary.items()), flush=True)
    exit_status = 0 if outcome == "done" else 1
    # empo2-status on the run from now on: finished, with this, the summary and each role's exit
    mark_finished(cfg.run_dir, outcome, exit_status, summary["policy_version"])
    if outcome != "done":
        for child in launcher.children:
            if child.process.returncode not in (0, -signal.SIGTERM, None) or child.name in outcome:
                print(f"[launch] --- last lines of {child.log_path} ---\n{child.tail()}", flush=True)
    return exit_status
