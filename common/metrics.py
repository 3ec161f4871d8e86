"""Prometheus metrics of every role, in one place, named empo2_<role>_<what>_<unit>.

Each process has its own registry (no default-process collectors mixed in) served on its own
port (MetricsConfig.port). Every role exports messages in/out, rejected messages by reason and
the policy version it last saw, so a Grafana board can line roles up by version.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Besides Prometheus, a run's metrics log <run_dir>/metrics.jsonl, one JSON record per line: the
# learner's "step" records (learner/train.py) and the evaluations' "eval" records (evaluation/eval.py),
# read by empo2-plot (evaluation/plot.py). Lines are appended whole (one write each).
METRICS_LOG = "metrics.jsonl"


def read_log(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(step records, eval records) of a run, in file order; cut or foreign lines are skipped."""
    steps, evals = [], []
    path = run_dir / METRICS_LOG
    if not path.exists():
        raise FileNotFoundError(f"{path}: no metrics log (the learner writes it, one line per step)")
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = record.get("record", "step") if isinstance(record, dict) else None
        (steps if kind == "step" else evals if kind == "eval" else []).append(record)
    return steps, evals


class _MetricsServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # A scraper that gave up (its timeout, while this process was stopped or busy) and hung up:
        # the page's read or write fails on the closed socket. Its business, not this role's error.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> ThreadingHTTPServer:
    """Serve `registry` on http://host:port/metrics, always in the classic text format (0.0.4).

    Not prometheus_client's start_http_server: it answers Prometheus (which asks for OpenMetrics)
    in OpenMetrics, and its OpenMetrics writer (0.26) turns the ':' of sample names into '_', so
    vLLM's `vllm:generation_tokens_total` would be stored as `vllm_generation_tokens_total` while
    a plain scrape (empo2-status, the tests) sees `vllm:...`. One format, one set of names."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # a scrape a second is not worth a log line
            pass

    server = _MetricsServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name=f"metrics:{port}", daemon=True).start()
    return server


# The metrics other code reads from a scrape (empo2-status, the launcher's progress line, empo2-tta, the
# benchmarks): named here once and imported there, so that renaming one renames its readers. The
# definitions below use these names; the three RoleMetrics makes for every role and the learner's
# staleness gauge (named after its step record's field) are checked against them by a unit test
# (tests/unit/common/test_metrics.py). A counter is named as a scrape shows it, with _total
# (prometheus_client registers its family without), a histogram by its family (a scrape shows
# <name>_bucket, <name>_sum and <name>_count).
POLICY_SERVER_POLICY_VERSION = "empo2_policy_server_policy_version"
POLICY_SERVER_READY = "empo2_policy_server_ready"
POLICY_SERVER_REQUESTS_IN_FLIGHT = "empo2_policy_server_requests_in_flight"
POLICY_SERVER_GENERATED_TOKENS = "empo2_policy_server_generated_tokens_total"
POLICY_SERVER_PROMPT_TOKENS = "empo2_policy_server_prompt_tokens_total"
POLICY_SERVER_REQUEST_LATENCY = "empo2_policy_server_request_latency_seconds"
ENV_ACTOR_EPISODES = "empo2_env_actor_episodes_total"
ENV_ACTOR_ENV_STEPS = "empo2_env_actor_env_steps_total"
ENV_ACTOR_INVALID_ACTIONS = "empo2_env_actor_invalid_actions_mapped_total"
ENV_ACTOR_MEMORY_FALLBACKS = "empo2_env_actor_memory_fallbacks_total"
ENV_ACTOR_TIPS_SHOWN = "empo2_env_actor_tips_shown_total"
ENV_ACTOR_TURNS = "empo2_env_actor_turns_total"
ENV_ACTOR_TIP_TURNS = "empo2_env_actor_tip_turns_total"
ENV_ACTOR_STEP_SECONDS = "empo2_env_actor_step_seconds"
REPLAY_BUFFER_TRAJECTORIES_ACCEPTED = "empo2_replay_buffer_trajectories_accepted_total"
REPLAY_BUFFER_OPEN_SLOTS = "empo2_replay_buffer_open_slots"
REPLAY_BUFFER_LEASE_RENEWED_AT = "empo2_replay_buffer_lease_renewed_at_seconds"
REPLAY_BUFFER_GROUPS_OPEN = "empo2_replay_buffer_groups_open"
REPLAY_BUFFER_GROUPS_READY = "empo2_replay_buffer_groups_ready"
REPLAY_BUFFER_LOG_FSYNC_SECONDS = "empo2_replay_buffer_log_fsync_seconds"
MEMORY_SERVICE_ERRORS = "empo2_memory_service_errors_total"
MEMORY_SERVICE_ENTRIES = "empo2_memory_service_entries"
MEMORY_SERVICE_RETRIEVAL_HITS = "empo2_memory_service_retrieval_hits"
MEMORY_SERVICE_REFLECTIONS = "empo2_memory_service_reflections_total"
MEMORY_SERVICE_EMBEDDING_BATCH_SIZE = "empo2_memory_service_embedding_batch_size"
MEMORY_SERVICE_EMBEDDING_CACHE = "empo2_memory_service_embedding_cache_total"
LEARNER_POLICY_VERSION = "empo2_learner_policy_version"
LEARNER_STEPS = "empo2_learner_steps_total"
LEARNER_TOKENS = "empo2_learner_tokens_total"
LEARNER_STEP_SECONDS = "empo2_learner_step_seconds"
LEARNER_STALENESS_MEAN_VERSIONS = "empo2_learner_staleness_mean_versions"


class RoleMetrics:
    """The metrics every role has; role-specific ones are added by the subclasses below."""

    def __init__(self, role: str):
        self.role = role
        self.registry = CollectorRegistry(auto_describe=True)
        p = f"empo2_{role}"
        self.messages_in = Counter(f"{p}_messages_received", "Messages received", ["kind"], registry=self.registry)
        self.messages_out = Counter(f"{p}_messages_sent", "Messages sent", ["kind"], registry=self.registry)
        self.rejected = Counter(
            f"{p}_messages_rejected", "Malformed or refused messages", ["reason"], registry=self.registry
        )
        self.errors = Counter(f"{p}_errors", "Errors while handling work", ["where"], registry=self.registry)
        self.handshake_failures = Counter(
            f"{p}_handshake_failures",
            "Connections refused by CURVE (security.curve): auth (key not authorized), protocol or other (no CURVE, wrong keys)",
            ["reason"],
            registry=self.registry,
        )
        self.policy_version = Gauge(f"{p}_policy_version", "Latest policy version seen", registry=self.registry)

    def _counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(f"empo2_{self.role}_{name}", doc, list(labels), registry=self.registry)

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(f"empo2_{self.role}_{name}", doc, registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(f"empo2_{self.role}_{name}", doc, buckets=buckets, registry=self.registry)

    def serve(self, host: str, port: int) -> None:
        serve_metrics(self.registry, host, port)


_SECONDS = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
_PHASE_SECONDS = (0.001, 0.005, *_SECONDS)


class VllmEngineMetrics:
    """vLLM's own engine metrics, re-exported on the policy server's port: running and waiting
    requests, KV-cache use, prompt and generation tokens, time to first token and the rest of
    `vllm:*`. vLLM's PrometheusStatLogger (vllm.v1.metrics.loggers, on by default while
    disable_log_stats is false) registers them in prometheus_client's global registry of the
    process that runs AsyncLLM; the roles serve their own registries, so this collector hands
    those families on at each scrape. Nothing until the engine has started."""

    def describe(self) -> list:
        return []  # names are vLLM's, known only once it runs: no clash check at registration

    def collect(self):
        from prometheus_client import REGISTRY

        for family in REGISTRY.collect():
            if family.name.startswith("vllm:"):
                yield family


class PolicyServerMetrics(RoleMetrics):
    def __init__(self) -> None:
        super().__init__("policy_server")
        self.registry.register(VllmEngineMetrics())
        self.ready = Gauge(POLICY_SERVER_READY, "1 once the engine serves requests", registry=self.registry)
        self.requests_in_flight = Gauge(
            POLICY_SERVER_REQUESTS_IN_FLIGHT, "Generation requests being served", registry=self.registry
        )
        self.generated_tokens = Counter(
            POLICY_SERVER_GENERATED_TOKENS, "Response tokens generated", registry=self.registry
        )
        self.prompt_tokens = Counter(POLICY_SERVER_PROMPT_TOKENS, "Prompt tokens processed", registry=self.registry)
        self.request_latency = Histogram(
            POLICY_SERVER_REQUEST_LATENCY, "Generation latency", buckets=_SECONDS, registry=self.registry
        )
        self.requests_retried = self._counter(
            "requests_retried", "Generations aborted by a weight update and run again (on_update=abort)"
        )
        self.weight_updates = self._counter("weight_updates", "Weight updates applied")
        self.weight_update_seconds = self._histogram(
            "weight_update_seconds", "Receive-to-live time of an update", _SECONDS
        )
        self.weight_update_bytes = self._counter("weight_update_bytes", "Weight bytes received")


class EnvActorMetrics(RoleMetrics):
    def __init__(self) -> None:
        super().__init__("env_actor")
        self.episodes = Counter(ENV_ACTOR_EPISODES, "Episodes finished and uploaded", ["mode"], registry=self.registry)
        self.episodes_success = self._counter(
            "episodes_success", "Episodes solved: done with score > 70 (Trajectory.success)", ("mode",)
        )
        self.env_steps = Counter(ENV_ACTOR_ENV_STEPS, "Environment steps taken", registry=self.registry)
        self.invalid_actions = Counter(
            ENV_ACTOR_INVALID_ACTIONS, "Generated actions mapped to a valid one", registry=self.registry
        )
        self.chains = self._counter(
            "prompt_chains", "Prompts that start a token chain (turn 0, history trims): the learner's sequences"
        )
        self.memory_fallbacks = Counter(
            ENV_ACTOR_MEMORY_FALLBACKS,
            "Turns that went without tips because memory was unreachable",
            registry=self.registry,
        )
        self.tips_shown = Counter(ENV_ACTOR_TIPS_SHOWN, "Tips put into prompts", registry=self.registry)
        self.turns = Counter(
            ENV_ACTOR_TURNS, "Turns played, by mode (the denominator of tip_turns)", ["mode"], registry=self.registry
        )
        self.tip_turns = Counter(
            ENV_ACTOR_TIP_TURNS,
            "Turns whose retrieval put at least one tip into the prompt, by mode",
            ["mode"],
            registry=self.registry,
        )
        self.strategies = self._counter("strategies", "SGE: strategies written (a turn's strategy before its action)")
        self.strategy_tokens = self._histogram(
            "strategy_tokens", "SGE: sampled tokens of one strategy", (4, 8, 16, 24, 32, 48, 64, 96, 128)
        )
        self.reflections = self._counter(
            "strategy_reflections",
            "SGE: a group's reflection asked for: shown, empty (none yet), unavailable",
            ("outcome",),
        )
        self.last_score = self._gauge("last_episode_score", "Score of the last finished episode")
        self.step_seconds = Histogram(
            ENV_ACTOR_STEP_SECONDS,
            "Wall time of one turn (generate + env step)",
            buckets=_SECONDS,
            registry=self.registry,
        )


class ReplayBufferMetrics(RoleMetrics):
    def __init__(self) -> None:
        super().__init__("replay_buffer")
        self.trajectories = Counter(
            REPLAY_BUFFER_TRAJECTORIES_ACCEPTED, "Trajectories accepted and persisted", ["mode"], registry=self.registry
        )
        self.trajectories_success = self._counter(
            "trajectories_success", "Accepted trajectories of solved episodes (done, score > 70)", ("mode",)
        )
        self.duplicates = self._counter("trajectories_duplicate", "Re-sent trajectories already held")
        self.assignments = self._counter("assignments", "Rollout slots handed out", ("mode",))
        self.reassigned = self._counter("assignments_reissued", "Slots handed out again after their lease expired")
        self.assignments_returned = self._counter(
            "assignments_returned", "Unfinished slots given back by actors that stopped gracefully"
        )
        # leases (replay_buffer/buffer.py, LeaseCounts): since start, one gauge per event
        self.leases = Gauge(
            "empo2_replay_buffer_leases",
            "Lease events since start: renewed, lost (a renewal of a slot no longer the sender's), lapsed "
            "(handed out again), released_restart (the actor restarted), released_return",
            ["event"],
            registry=self.registry,
        )
        # what the open groups wait for: unfilled slots by the actor id holding their lease ("none": no
        # one holds it, it goes to the next actor that asks); the label values are the live leases' holders
        self.open_slots = Gauge(
            REPLAY_BUFFER_OPEN_SLOTS,
            "Unfilled slots of the open groups, by the actor holding their lease (none: not leased)",
            ["holder"],
            registry=self.registry,
        )
        self.lease_renewed_at = Gauge(
            REPLAY_BUFFER_LEASE_RENEWED_AT,
            "Unix time of the oldest last renewal among the slots each actor holds (empo2-status: a stopped renewer)",
            ["holder"],
            registry=self.registry,
        )
        self.groups_open = Gauge(
            REPLAY_BUFFER_GROUPS_OPEN, "Groups handed out and not yet complete", registry=self.registry
        )
        self.groups_ready = Gauge(
            REPLAY_BUFFER_GROUPS_READY, "Complete groups waiting for the learner", registry=self.registry
        )
        self.groups_served = self._counter("groups_served", "Groups handed to the learner")
        self.groups_dropped_stale = self._counter("groups_dropped_stale", "Groups dropped as too stale")
        self.groups_confirmed = self._counter("groups_confirmed", "Served groups the learner confirmed it used")
        self.groups_requeued = self._counter(
            "groups_requeued", "Served groups given back unconfirmed (confirm timeout, or the learner restarted)"
        )
        self.confirms_unknown = self._counter("batch_confirms_unknown", "Confirms of a batch not in flight")
        self.batch_parts = self._counter("batch_parts", "Batch messages (parts within the learner's limit) sent")
        self.log_records_replayed = self._gauge("log_records_replayed", "Log records read back at start-up")
        self.log_records_skipped = self._counter(
            "log_records_skipped", "Corrupt log records skipped at start-up, by fault", ("fault",)
        )
        self.log_fsync_seconds = Histogram(
            REPLAY_BUFFER_LOG_FSYNC_SECONDS,
            "Group commit: one fsync of the log",
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5),
            registry=self.registry,
        )
        self.staleness = self._histogram(
            "batch_staleness_versions", "Learner version minus sample version", (0, 1, 2, 3, 4, 6, 8, 16)
        )
        # HeRL (replay_buffer/hindsight.py): replay_buffer.HindsightCounts since start, one gauge per field
        self.hindsight = Gauge(
            "empo2_replay_buffer_hindsight",
            "HeRL since start: groups_guided, guided_episodes, revisions_inserted, revisions_beating_best, "
            "bonus_paid, guided_timeouts",
            ["count"],
            registry=self.registry,
        )


class MemoryServiceMetrics(RoleMetrics):
    def __init__(self) -> None:
        super().__init__("memory_service")
        self.entries = Gauge(MEMORY_SERVICE_ENTRIES, "Memory entries stored, all memories", registry=self.registry)
        self.memories = self._gauge("memories", "Distinct memories (keys)")
        self.retrievals = self._counter("retrievals", "Retrieval queries answered")
        self.hits = Histogram(
            MEMORY_SERVICE_RETRIEVAL_HITS,
            "Memories returned per query",
            buckets=(0, 1, 2, 3, 5, 8, 10),
            registry=self.registry,
        )
        self.distinct_reflections = self._histogram(
            "retrieval_distinct_reflections",
            "Distinct reflections among the memories returned per query (entries of one episode share one)",
            (0, 1, 2, 3, 5, 8, 10),
        )
        self.reflections = Counter(
            MEMORY_SERVICE_REFLECTIONS, "Reflections written by the policy", registry=self.registry
        )
        self.reflection_seconds = self._histogram("reflection_seconds", "Reflection latency", _SECONDS)
        self.reflection_queue = self._gauge("reflection_queue_depth", "Episodes waiting for reflection")
        self.reports_duplicate = self._counter("reports_duplicate", "Episode reports of an episode already queued")
        self.reports_given_up = self._counter(
            "reports_given_up", "Queued episode reports dropped after memory_service.reflection_attempts failures"
        )
        self.reflection_batch = self._histogram(
            "reflection_batch_size", "Episodes reflected on together", (1, 2, 4, 8, 16, 32)
        )
        self.embedding_batch = Histogram(
            MEMORY_SERVICE_EMBEDDING_BATCH_SIZE,
            "Texts embedded per call",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self.embedding_cache = Counter(
            MEMORY_SERVICE_EMBEDDING_CACHE,
            "Texts to embed, answered from memory_service.embedding_cache (hit) or embedded (miss)",
            ["result"],
            registry=self.registry,
        )
        self.memory_entries = Gauge(
            "empo2_memory_service_memory_entries", "Entries per memory", ["memory"], registry=self.registry
        )
        self.strategies = self._gauge("strategies", "SGE: episodes' opening strategies stored, all tasks")
        self.strategy_reflections = self._counter(
            "strategy_reflections", "SGE: reflections served (a group's members share one)"
        )


class LearnerMetrics(RoleMetrics):
    def __init__(self) -> None:
        super().__init__("learner")
        self.steps = Counter(
            LEARNER_STEPS, "Learner steps taken (batches; the policy version rises by one each)", registry=self.registry
        )
        self.optimizer_steps = self._counter(
            "optimizer_steps", "Optimizer steps taken: one per mini-batch (learner.mini_batch_samples) of each batch"
        )
        self.samples = self._counter("samples", "Turn samples trained on")
        self.tokens = Counter(LEARNER_TOKENS, "Response tokens in the loss", registry=self.registry)
        self.forward_tokens = self._counter(
            "forward_tokens",
            "Tokens laid out in the update pass's forwards (learner.packing: a chain once, a shared prefix once)",
        )
        self.samples_nonfinite = self._counter(
            "samples_dropped_nonfinite", "Turn samples dropped before the step: a non-finite advantage or log-prob"
        )
        self.loss = self._gauge("loss", "Last policy loss")
        self.step_seconds = Histogram(
            LEARNER_STEP_SECONDS, "Wall time of one optimizer step", buckets=_SECONDS, registry=self.registry
        )
        self.push_seconds = self._histogram("weight_push_seconds", "Wall time of one weight push", _SECONDS)
        self.server_version_lag = Gauge(
            "empo2_learner_server_version_lag",
            "Versions a policy server is behind the learner (background pushes: the last version it confirmed)",
            ["server"],
            registry=self.registry,
        )
        self.catch_up_pushes = self._counter(
            "catch_up_pushes", "Pushes of the current weights to one server found behind (restarted) in a batch wait"
        )
        # the paper's Figure 12 time breakdown: phases of learner/train.py's PHASES, observed when they run
        self.phase_seconds = Histogram(
            "empo2_learner_phase_seconds",
            "Wall time of one phase of a learner step, by phase: batch_wait, samples, score (without grad), "
            "forward_backward, optimizer, push, checkpoint",
            ["phase"],
            buckets=_PHASE_SECONDS,
            registry=self.registry,
        )
        # the low-probability mask by mode (learner/step.py, StepStats.masked_fraction_<mode>), mode="all" overall
        self.score_by_strategy_temperature = Gauge(
            "empo2_learner_score_by_strategy_temperature",
            "SGE: mean episode score of the last batch's episodes whose strategies were sampled at this temperature",
            ["temperature"],
            registry=self.registry,
        )
        self.masked_fraction = Gauge(
            "empo2_learner_masked_fraction",
            "Fraction of turn samples dropped by the low-probability mask, by mode: all, on_policy, "
            "on_policy_tips, off_policy (a mode is set only when the batch has samples of it)",
            ["mode"],
            registry=self.registry,
        )
        self.stats = {
            name: self._gauge(name, doc)
            for name, doc in {
                "ratio_mean": "Mean importance ratio",
                "ratio_max": "Max importance ratio",
                "clip_fraction": "Fraction of tokens clipped",
                "dual_clip_fraction": "Fraction of tokens hit by the dual clip",
                "behaviour_weight_mean": "Decoupled PPO: mean proximal/behaviour weight",
                "entropy_mean": "Mean policy entropy (nats) at the kept response positions, measured at every step",
                "kl_mean": "Mean k3 KL to the initial policy (if kl_coef)",
                "behaviour_weight_capped_fraction": "Decoupled PPO: fraction of tokens over the weight cap",
                "advantage_abs_mean": "Mean |advantage|",
                "zero_advantage_fraction": "Fraction of the last batch's samples with advantage 0 (all-equal groups)",
                "resident_mb": "The learner's resident memory (MB) after its last step, its freed heap given back",
                "push_backlog": "Background pushes: policy servers that have not confirmed the newest version",
                "logprob_mismatch_mean_nats": "Mean |vLLM - learner| log-prob on same-version on-policy tokens",
                "logprob_mismatch_max_nats": "Max |vLLM - learner| log-prob on same-version on-policy tokens",
                # the rollout correction (learner.rollout_correction), rho = pi_old/pi_behaviour on the kept tokens
                "rollout_kl_mean": "k3 estimate of KL(behaviour || learner before the update) per token, last step",
                "rollout_logratio_abs_max": "Max |log pi_old - log pi_behaviour| over the last step's tokens",
                "rollout_logratio_abs_p50": "p50 of |log pi_old - log pi_behaviour| (the largest micro-batch's)",
                "rollout_logratio_abs_p99": "p99 of |log pi_old - log pi_behaviour| (the largest micro-batch's)",
                "rollout_weight_mean": "Rollout correction: mean weight on the loss (1 under none)",
                "rollout_corrected_fraction": "Rollout correction: fraction of tokens truncated (tis) or given no "
                "gradient (mis, token_mask)",
                "staleness_mean_versions": "Mean policy-version lag of the batch",
                "episode_score_mean": "Mean final score of the batch's episodes",
                "lr": "Learning rate of the last step",
                "weight_push_engine_seconds": "Part of the last weight push spent in the servers' engines (vLLM's load)",
                # exploration (learner/exploration.py: a state is the room, inventory and visible objects, hashed)
                "distinct_states_per_episode": "Mean distinct states an episode of the last batch acted in",
                "distinct_states_per_group": "Mean distinct states of a group's episodes together (last batch)",
                "distinct_actions_per_group": "Mean distinct actions a group's episodes executed (last batch)",
                "collapsed_group_fraction": "Fraction of the last batch's groups whose episodes all have the same "
                "state sequence (groups of two or more episodes)",
                # the memory's use (learner/memory_use.py), set only when the batch has turns of a tip mode
                "tip_turn_fraction": "Fraction of the last batch's turns whose prompt showed at least one tip",
                "tip_samples_trained_fraction": "Fraction of the last batch's tip turns (prompt showed tips) that the "
                "low-probability mask kept in the loss",
                "retrieval_hit_fraction": "Of the last batch's tip-mode turns whose retrieval answered, those given "
                "at least one memory",
                "retrieval_hits_mean": "Memories retrieved per tip-mode turn of the last batch (n of r_int = 1/(n+1))",
                "r_int_spread_mean": "Mean over the last batch's tip-mode groups of the std of r_int over the group's "
                "turns (0: the bonus cancels in the advantage)",
                "r_int_varies_fraction": "Fraction of the last batch's tip-mode groups whose r_int is not constant",
                "strategies_per_episode": "SGE: mean strategies an episode of the last batch wrote",
                "distinct_strategies_per_group": "SGE: mean distinct strategies of a group's episodes (last batch)",
            }.items()
        }

    def observe_step(self, record: dict) -> None:
        """One learner step's record (learner/train.py, step_record)."""
        self.steps.inc()
        self.optimizer_steps.inc(record.get("optimizer_steps", 1))
        self.samples.inc(record["samples"])
        self.tokens.inc(record["tokens"])
        self.forward_tokens.inc(record.get("forward_tokens", 0))
        self.samples_nonfinite.inc(record.get("samples_nonfinite", 0))
        self.loss.set(record["loss"])
        self.step_seconds.observe(record["step_seconds"])
        self.push_seconds.observe(record["weight_push_seconds"])
        self.policy_version.set(record["policy_version"])
        for phase, seconds in record["phase_seconds"].items():
            self.phase_seconds.labels(phase).observe(seconds)
        for name, gauge in self.stats.items():
            if record.get(name) is not None:
                gauge.set(record[name])
        if "masked_fraction" in record:
            self.masked_fraction.labels("all").set(record["masked_fraction"])
        for name, value in record.items():
            if name.startswith("masked_fraction_") and value is not None:
                self.masked_fraction.labels(name.removeprefix("masked_fraction_")).set(value)
        for temperature, score in record.get("score_by_strategy_temperature", {}).items():
            self.score_by_strategy_temperature.labels(temperature).set(score)


class LaunchMetrics:
    """The supervising launcher's own metrics (deploy/launch.py), labelled by role name
    (policy_server0, env_actor1, learner, ...): its restarts, whether it runs, how it last exited."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.restarts = Counter(
            "empo2_launch_restarts",
            "Times a role was started again: after it exited (reason exit) or was killed for no progress (hung)",
            ["role", "reason"],
            registry=self.registry,
        )
        self.role_up = Gauge(
            "empo2_launch_role_up", "1 while the role's process runs", ["role"], registry=self.registry
        )
        self.last_exit_code = Gauge(
            "empo2_launch_last_exit_code",
            "Exit status of the role's last exit (-N: signal N)",
            ["role"],
            registry=self.registry,
        )
        self.tracking_failures = Counter(
            "empo2_launch_tracking_failures",
            "Times sending the run's records to a tracker (tracking.backends) failed; the run went on",
            registry=self.registry,
        )

        self._server = None

    def serve(self, host: str, port: int) -> None:
        self._server = serve_metrics(self.registry, host, port)

    def close(self) -> None:
        """Stop serving (the launcher's process outlives one run in tests and tools)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class EvaluatorMetrics(RoleMetrics):
    """The periodic evaluation (evaluation/periodic.py): checkpoints scored, by outcome."""

    def __init__(self) -> None:
        super().__init__("evaluator")
        self.evaluations = self._counter("evaluations", "Checkpoint evaluations run, by outcome", ("outcome",))
        for outcome in ("ok", "failed"):  # exported from the start, before the first evaluation
            self.evaluations.labels(outcome)
        self.last_step = self._gauge("last_scored_step", "Policy version of the newest checkpoint scored")


ROLE_METRICS = (
    PolicyServerMetrics,
    EnvActorMetrics,
    ReplayBufferMetrics,
    MemoryServiceMetrics,
    LearnerMetrics,
    EvaluatorMetrics,
)


def family_samples(registry: CollectorRegistry) -> dict[str, list[str]]:
    """Family name -> the sample names it exports (counter `_total`, histogram `_bucket`/`_sum`/
    `_count`), also for labelled families that have no samples yet."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    return {f.name: [f.name + s for s in suffixes.get(f.type, [""])] for f in registry.collect()}


def exported_families() -> dict[str, list[str]]:
    """family_samples of every role and the launcher (the deploy files are checked against it)."""
    out: dict[str, list[str]] = {}
    for cls in (*ROLE_METRICS, LaunchMetrics):
        out.update(family_samples(cls().registry))
    return out


def exported_sample_names() -> set[str]:
    return {s for samples in exported_families().values() for s in samples}
