"""Write grafana-dashboard.json: the pipeline's throughput, learning and health on one board.

    python deploy/monitoring/make_dashboard.py   # regenerates the JSON next to this file
Import the JSON in Grafana (Dashboards -> Import) with a Prometheus data source scraping
deploy/monitoring/prometheus.yml's targets.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# (title, unit, [PromQL expressions]) in rows of three
PANELS = [
    ("Env steps / s", "ops", ["sum(rate(empo2_env_actor_env_steps_total[1m]))"]),
    ("Episodes accepted / s", "ops", ["sum by (mode) (rate(empo2_replay_buffer_trajectories_accepted_total[1m]))"]),
    ("Generated tokens / s", "ops", ["sum(rate(empo2_policy_server_generated_tokens_total[1m]))"]),
    (
        "Policy version by role",
        "none",
        [
            "empo2_learner_policy_version",
            "empo2_policy_server_policy_version",
            "empo2_env_actor_policy_version",
            "empo2_replay_buffer_policy_version",
            "empo2_memory_service_policy_version",
        ],
    ),
    ("Learner loss", "none", ["empo2_learner_loss"]),
    (
        "Learner step time (p50)",
        "s",
        ["histogram_quantile(0.5, sum by (le) (rate(empo2_learner_step_seconds_bucket[5m])))"],
    ),
    # the paper's Figure 12: where the learner's time goes, per phase of its step (learner/train.py, PHASES)
    (
        "Learner time by phase (share of wall time)",
        "percentunit",
        ["sum by (phase) (rate(empo2_learner_phase_seconds_sum[5m]))"],
    ),
    (
        "Learner phase time per step (mean)",
        "s",
        [
            "sum by (phase) (rate(empo2_learner_phase_seconds_sum[15m]))"
            " / sum by (phase) (rate(empo2_learner_phase_seconds_count[15m]))"
        ],
    ),
    (
        "vLLM vs learner log-prob mismatch",
        "none",
        ["empo2_learner_logprob_mismatch_mean_nats", "empo2_learner_logprob_mismatch_max_nats"],
    ),
    (
        "Ratio / clipping / masking",
        "percentunit",
        [
            "empo2_learner_clip_fraction",
            "empo2_learner_dual_clip_fraction",
            'empo2_learner_masked_fraction{mode="all"}',
        ],
    ),
    # the low-probability mask by mode (learner.low_prob_mask; the paper's rule judges every mode while memory is on)
    ("Low-probability mask by mode", "percentunit", ["empo2_learner_masked_fraction"]),
    (
        "Optimizer steps per learner step (mini-batches)",
        "none",
        ["rate(empo2_learner_optimizer_steps_total[15m]) / rate(empo2_learner_steps_total[15m])"],
    ),
    ("Staleness of trained samples", "none", ["empo2_learner_staleness_mean_versions"]),
    (
        "Episode score (batch mean)",
        "none",
        ["empo2_learner_episode_score_mean", "avg(empo2_env_actor_last_episode_score)"],
    ),
    (
        "Success rate by mode (done, score > 70)",
        "percentunit",
        [
            "sum by (mode) (rate(empo2_replay_buffer_trajectories_success_total[15m]))"
            " / sum by (mode) (rate(empo2_replay_buffer_trajectories_accepted_total[15m]))",
            "sum(rate(empo2_env_actor_episodes_success_total[15m])) / sum(rate(empo2_env_actor_episodes_total[15m]))",
        ],
    ),
    ("Memory entries", "none", ["empo2_memory_service_entries"]),
    (
        "Memories per retrieval (mean)",
        "none",
        ["rate(empo2_memory_service_retrieval_hits_sum[5m]) / rate(empo2_memory_service_retrieval_hits_count[5m])"],
    ),
    ("Reflection queue depth", "none", ["empo2_memory_service_reflection_queue_depth"]),
    (
        "Memory embedding cache hit rate",
        "percentunit",
        [
            'rate(empo2_memory_service_embedding_cache_total{result="hit"}[5m])'
            " / sum(rate(empo2_memory_service_embedding_cache_total[5m]))"
        ],
    ),
    (
        "Weight push time (p50)",
        "s",
        ["histogram_quantile(0.5, sum by (le) (rate(empo2_learner_weight_push_seconds_bucket[15m])))"],
    ),
    (
        "Groups ready / dropped stale",
        "none",
        ["empo2_replay_buffer_groups_ready", "empo2_replay_buffer_groups_dropped_stale_total"],
    ),
    (
        "Rejected messages / s",
        "ops",
        ['sum by (job, reason) (rate({__name__=~"empo2_.*_messages_rejected_total"}[1m]))'],
    ),
    (
        "Memory fallbacks / invalid actions",
        "ops",
        [
            "sum(rate(empo2_env_actor_memory_fallbacks_total[1m]))",
            "sum(rate(empo2_env_actor_invalid_actions_mapped_total[1m]))",
        ],
    ),
    ("Requests in flight", "none", ["empo2_policy_server_requests_in_flight"]),
    ("Learning rate", "none", ["empo2_learner_lr"]),
    ("Weight push: engine part (last)", "s", ["empo2_learner_weight_push_engine_seconds"]),
    ("Generations rerun at updates / s", "ops", ["sum(rate(empo2_policy_server_requests_retried_total[5m]))"]),
    # operations: the processes themselves (the launcher's supervision, deploy/launch.py)
    ("Roles up (scrape)", "none", ['up{job=~"empo2_.*"}', "empo2_launch_role_up"]),
    (
        "Role restarts, tracking failures",
        "none",
        ["empo2_launch_restarts_total", "empo2_launch_tracking_failures_total"],
    ),
    # a restarted policy server waits for the run's newest weights; the learner pushes them to it alone
    ("Catch-up weight pushes (restarted servers)", "none", ["empo2_learner_catch_up_pushes_total"]),
    # background pushes: how many versions each server is behind, servers with a version waiting
    (
        "Weight pushes: server version lag, push backlog",
        "none",
        ["empo2_learner_server_version_lag", "empo2_learner_push_backlog"],
    ),
    # HeRL: groups held for guided revisions, revisions that took a slot or beat the group's best, bonus paid
    ("HeRL: guided groups and revisions", "none", ['empo2_replay_buffer_hindsight{count!="bonus_paid"}']),
    ("HeRL: improvement bonus paid", "none", ['empo2_replay_buffer_hindsight{count="bonus_paid"}']),
    (
        "SGE: strategies written / s, reflections by outcome / s, served / s",
        "ops",
        [
            "sum(rate(empo2_env_actor_strategies_total[5m]))",
            "sum by (outcome) (rate(empo2_env_actor_strategy_reflections_total[5m]))",
            "rate(empo2_memory_service_strategy_reflections_total[5m])",
        ],
    ),
    (
        "SGE: strategy length (p50, p95 tokens), strategies stored",
        "none",
        [
            "histogram_quantile(0.5, sum by (le) (rate(empo2_env_actor_strategy_tokens_bucket[5m])))",
            "histogram_quantile(0.95, sum by (le) (rate(empo2_env_actor_strategy_tokens_bucket[5m])))",
            "empo2_memory_service_strategies",
        ],
    ),
    (
        "SGE: strategies per episode, distinct per group, score by strategy temperature",
        "none",
        [
            "empo2_learner_strategies_per_episode",
            "empo2_learner_distinct_strategies_per_group",
            "empo2_learner_score_by_strategy_temperature",
        ],
    ),
    (
        "Messages / s by role",
        "ops",
        ['sum by (job, kind) (rate({__name__=~"empo2_.*_messages_(received|sent)_total"}[1m]))'],
    ),
    ("Errors / s by role", "ops", ['sum by (job, where) (rate({__name__=~"empo2_.*_errors_total"}[1m]))']),
    (
        "Learner tokens / samples per s",
        "ops",
        ["sum(rate(empo2_learner_tokens_total[5m]))", "sum(rate(empo2_learner_samples_total[5m]))"],
    ),
    # learner.packing: the update pass's tokens against the response tokens it trains on
    ("Learner tokens forwarded / s", "ops", ["sum(rate(empo2_learner_forward_tokens_total[5m]))"]),
    # a chain per episode unless the history is trimmed: more is what the learner pays for trims
    (
        "Prompt chains per episode",
        "none",
        ["sum(rate(empo2_env_actor_prompt_chains_total[5m])) / sum(rate(empo2_env_actor_episodes_total[5m]))"],
    ),
    ("Policy servers ready", "none", ["empo2_policy_server_ready"]),
    ("Prompt tokens / s", "ops", ["sum(rate(empo2_policy_server_prompt_tokens_total[1m]))"]),
    (
        "Generation latency (p50, p95)",
        "s",
        [
            "histogram_quantile(0.5, sum by (le) (rate(empo2_policy_server_request_latency_seconds_bucket[5m])))",
            "histogram_quantile(0.95, sum by (le) (rate(empo2_policy_server_request_latency_seconds_bucket[5m])))",
        ],
    ),
    (
        "Weight updates on the servers",
        "none",
        [
            "sum(rate(empo2_policy_server_weight_updates_total[15m]))",
            "histogram_quantile(0.5, sum by (le) (rate(empo2_policy_server_weight_update_seconds_bucket[15m])))",
            "sum(rate(empo2_policy_server_weight_update_bytes_total[15m]))",
        ],
    ),
    (
        "Env turn time (p50)",
        "s",
        ["histogram_quantile(0.5, sum by (le) (rate(empo2_env_actor_step_seconds_bucket[5m])))"],
    ),
    (
        "Memory traffic / s",
        "ops",
        [
            "sum(rate(empo2_env_actor_tips_shown_total[1m]))",
            "rate(empo2_memory_service_retrievals_total[1m])",
            "rate(empo2_memory_service_reflections_total[5m])",
        ],
    ),
    (
        "Reflection latency (p50)",
        "s",
        ["histogram_quantile(0.5, sum by (le) (rate(empo2_memory_service_reflection_seconds_bucket[15m])))"],
    ),
    (
        "Memories and entries per memory",
        "none",
        ["empo2_memory_service_memories", "empo2_memory_service_memory_entries"],
    ),
    (
        "Buffer: assignments, re-issued, returned, duplicates, groups served / s",
        "ops",
        [
            "sum(rate(empo2_replay_buffer_assignments_total[5m]))",
            "rate(empo2_replay_buffer_assignments_reissued_total[5m])",
            "rate(empo2_replay_buffer_assignments_returned_total[5m])",
            "rate(empo2_replay_buffer_trajectories_duplicate_total[5m])",
            "rate(empo2_replay_buffer_groups_served_total[5m])",
        ],
    ),
    (
        "Buffer: leases (lapsed, released at an actor's restart, lost) and open groups' unfilled slots by holder",
        "none",
        [
            'empo2_replay_buffer_leases{event=~"lapsed|released_restart|released_return|lost"}',
            "empo2_replay_buffer_open_slots",
            "empo2_replay_buffer_groups_open",
        ],
    ),
    (
        "Batch staleness (p50, versions)",
        "none",
        ["histogram_quantile(0.5, sum by (le) (rate(empo2_replay_buffer_batch_staleness_versions_bucket[15m])))"],
    ),
    (
        "Importance ratio / behaviour weight",
        "none",
        [
            "empo2_learner_ratio_mean",
            "empo2_learner_ratio_max",
            "empo2_learner_behaviour_weight_mean",
            "empo2_learner_behaviour_weight_capped_fraction",
        ],
    ),
    (
        "Rollout correction: KL(behaviour || learner), |log rho| p50 / p99 / max, mean weight",
        "none",
        [
            "empo2_learner_rollout_kl_mean",
            "empo2_learner_rollout_logratio_abs_p50",
            "empo2_learner_rollout_logratio_abs_p99",
            "empo2_learner_rollout_logratio_abs_max",
            "empo2_learner_rollout_weight_mean",
        ],
    ),
    (
        "Rollout correction: tokens truncated or masked",
        "percentunit",
        ["empo2_learner_rollout_corrected_fraction"],
    ),
    (
        "Entropy / KL / |advantage|",
        "none",
        ["empo2_learner_entropy_mean", "empo2_learner_kl_mean", "empo2_learner_advantage_abs_mean"],
    ),
]

# exploration, per learner step (learner/exploration.py: a state is the room, inventory and visible objects,
# hashed; the paper's Figures 3 and 7): distinct states and actions, groups collapsed onto one path, entropy
PANELS += [
    (
        "Exploration: distinct states per episode / group, distinct actions per group",
        "none",
        [
            "empo2_learner_distinct_states_per_episode",
            "empo2_learner_distinct_states_per_group",
            "empo2_learner_distinct_actions_per_group",
        ],
    ),
    (
        "Exploration collapse: groups on one state sequence; samples with advantage 0",
        "percentunit",
        ["empo2_learner_collapsed_group_fraction", "empo2_learner_zero_advantage_fraction"],
    ),
    ("Policy entropy (nats, every step)", "none", ["empo2_learner_entropy_mean"]),
    # EMPO2's memory at work (learner/memory_use.py, the actors' tip turns, the memory's retrievals)
    (
        "Memory use: tip turns (learner batch; actors, by mode), tip turns trained, retrievals that hit",
        "percentunit",
        [
            "empo2_learner_tip_turn_fraction",
            "sum by (mode) (rate(empo2_env_actor_tip_turns_total[5m])) / sum by (mode) (rate(empo2_env_actor_turns_total[5m]))",
            "empo2_learner_tip_samples_trained_fraction",
            "empo2_learner_retrieval_hit_fraction",
            "empo2_learner_r_int_varies_fraction",
        ],
    ),
    (
        "Memory use: memories and distinct reflections per query, r_int spread in groups",
        "none",
        [
            "empo2_learner_retrieval_hits_mean",
            "empo2_learner_r_int_spread_mean",
            "histogram_quantile(0.5, sum by (le) (rate(empo2_memory_service_retrieval_distinct_reflections_bucket[5m])))",
        ],
    ),
    ("Learner resident memory after each step (MB): a leak raises it", "none", ["empo2_learner_resident_mb"]),
]

# reliability: what the doors refuse, the buffer's confirmations and its log, the reflection queue
PANELS += [
    (
        "Refused CURVE handshakes / s by role",
        "ops",
        ['sum by (job, reason) (rate({__name__=~"empo2_.*_handshake_failures_total"}[5m]))'],
    ),
    (
        "Batches: parts, groups confirmed, requeued, unknown confirms / s",
        "ops",
        [
            "rate(empo2_replay_buffer_batch_parts_total[5m])",
            "rate(empo2_replay_buffer_groups_confirmed_total[5m])",
            "rate(empo2_replay_buffer_groups_requeued_total[5m])",
            "rate(empo2_replay_buffer_batch_confirms_unknown_total[5m])",
        ],
    ),
    (
        "Buffer log: records replayed, skipped by fault",
        "none",
        ["empo2_replay_buffer_log_records_replayed", "sum by (fault) (empo2_replay_buffer_log_records_skipped_total)"],
    ),
    (
        "Buffer log fsync (p99, group commit)",
        "s",
        ["histogram_quantile(0.99, sum by (le) (rate(empo2_replay_buffer_log_fsync_seconds_bucket[5m])))"],
    ),
    (
        "Periodic evaluations (eval.every_steps): by outcome, newest step scored",
        "none",
        ["sum by (outcome) (empo2_evaluator_evaluations_total)", "empo2_evaluator_last_scored_step"],
    ),
    (
        "Reports duplicate / given up, samples dropped non-finite / s",
        "ops",
        [
            "rate(empo2_memory_service_reports_duplicate_total[5m])",
            "rate(empo2_memory_service_reports_given_up_total[5m])",
            "rate(empo2_learner_samples_dropped_nonfinite_total[5m])",
        ],
    ),
]

# vLLM's engine metrics (the policy servers re-export them: common.metrics.VllmEngineMetrics)
PANELS += [
    ("vLLM requests running / waiting", "none", ["vllm:num_requests_running", "vllm:num_requests_waiting"]),
    ("vLLM KV-cache use", "percentunit", ["vllm:kv_cache_usage_perc"]),
    (
        "vLLM prompt / generation tokens per s",
        "ops",
        ["sum(rate(vllm:prompt_tokens_total[1m]))", "sum(rate(vllm:generation_tokens_total[1m]))"],
    ),
    (
        "vLLM time to first token (p50, p95)",
        "s",
        [
            "histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m])))",
            "histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[5m])))",
        ],
    ),
]

# Exported metric families deliberately not on the board, and why (the dashboard test checks that
# every family the roles export is on a panel or here).
NOT_ON_DASHBOARD = {
    "empo2_memory_service_reflection_batch_size": "a batching diagnostic, read in benchmarks",
    "empo2_memory_service_embedding_batch_size": "a batching diagnostic, read in benchmarks",
    "empo2_launch_last_exit_code": "a last value, shown by empo2-status",
    "empo2_evaluator_policy_version": "the same as empo2_evaluator_last_scored_step, which is on a panel",
    "empo2_replay_buffer_lease_renewed_at_seconds": "a timestamp per lease holder, read by empo2-status (a stall)",
}
# ...and by pattern: vLLM's own families beyond the panels above (its documentation lists them;
# which ones exist depends on the vLLM version and its features, e.g. speculative decoding)
NOT_ON_DASHBOARD_PATTERNS = {r"vllm:.*": "vLLM's further engine metrics, scraped for ad-hoc queries"}


def panel_metric_names(expr: str) -> tuple[set[str], list[str]]:
    """The metric names a PromQL expression reads, and its `__name__=~` regexes (label values and
    recording-rule names, which hold a colon, are not metric names)."""
    regexes = re.findall(r'__name__=~"([^"]*)"', expr)
    names = set(re.findall(r"\b(?:empo2_[a-z0-9_]+|vllm:[a-z0-9_:]+)\b", re.sub(r'"[^"]*"', "", expr)))
    return names, regexes


def uncovered(families: dict[str, list[str]]) -> set[str]:
    """The families (name -> its sample names) that no panel reads and NOT_ON_DASHBOARD does not list."""
    names, regexes = set(), []
    for _, _, exprs in PANELS:
        for expr in exprs:
            n, r = panel_metric_names(expr)
            names |= n
            regexes += r
    return {
        family
        for family, samples in families.items()
        if family not in NOT_ON_DASHBOARD
        and not any(re.fullmatch(p, family) for p in NOT_ON_DASHBOARD_PATTERNS)
        and not any(s in names or any(re.fullmatch(r, s) for r in regexes) for s in samples)
    }


def dashboard() -> dict:
    panels = []
    for i, (title, unit, exprs) in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "gridPos": {"h": 8, "w": 8, "x": 8 * (i % 3), "y": 8 * (i // 3)},
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [{"refId": chr(65 + j), "expr": e, "legendFormat": "__auto"} for j, e in enumerate(exprs)],
            }
        )
    return {
        "title": "EMPO2 pipeline",
        "uid": "empo2-pipeline",
        "schemaVersion": 39,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]},
        "panels": panels,
    }


def main() -> None:
    out = Path(__file__).with_name("grafana-dashboard.json")
    out.write_text(json.dumps(dashboard(), indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
