"""Memory service: the current policy reflects on finished episodes; tips are stored and served.

Socket: ROUTER bound at endpoints.memory_service.
  in : Ping, MemoryQuery (env actors), EpisodeReport (env actors), StrategyQuery (env actors, SGE)
  out: Pong, MemoryResult, Ack, StrategyResult, ErrorReply
Client: DEALER to the policy servers (GenerateRequest for reflections, round-robin).

Episode reports are acknowledged once queued, and the queue is persisted (the store's SQLite
database, WAL) before the Ack: a killed service resumes it at restart. A worker thread asks the
policy for the reflection, embeds the episode's states and stores one entry per step, removing
the report from the queue in the same transaction; a failed reflection is tried again up to
memory_service.reflection_attempts times. Actors never wait on it.

SGE (sge.enabled): a report's opening strategy is stored with its score before the Ack
(memory_service/strategies.py), and a report with reflect=false (no rollout reads tips: GRPO + SGE)
is not queued for a reflection at all. A StrategyQuery is answered with the group's reflection.

Run: `empo2-memory-service [key=value ...]`.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time

import numpy as np
import zmq
from threadpoolctl import threadpool_limits

from common.config import RunFacts, SgeConfig
from common.logs import short_id
from common.metrics import MemoryServiceMetrics
from common.model_prep import resolve_model
from common.process import run_role
from common.server import serve_requests
from memory_service.config import MemoryServiceConfig
from memory_service.embedder import Embedder, uses_bf16
from memory_service.state_key import key_text
from memory_service.store import Entry, MemoryStore, memory_key
from memory_service.strategies import StrategyStore
from protocol import Client, ProtocolError, RemoteError, decode, encode
from protocol.codec import pack_frames, unpack_frames
from protocol.messages import (
    Ack,
    EpisodeReport,
    GenerateRequest,
    MemoryQuery,
    MemoryResult,
    Ping,
    Pong,
    StrategyQuery,
    StrategyResult,
    Wait,
)
from protocol.transport import RequestLost, process_uptime_s

log = logging.getLogger("memory_service")

# The stored reflection's first characters in the log line (the whole text is in the store).
LOGGED_REFLECTION_CHARS = 120
# A policy server still loading its engine answers not_ready: its reports wait this long and are asked
# again, without counting as a failed attempt.
NOT_READY_RETRY_S = 2.0
# Memories with a label of their own in empo2_memory_service_memory_entries; the rest share "other"
# (keys hold a client's variation number: the label set must stay bounded).
MAX_LABELLED_MEMORIES = 256
# An actor whose report met a full reflection queue (security.max_reflection_queue_bytes) is told this.
REPORT_RETRY_S = 5.0


def report_bytes(report: EpisodeReport) -> int:
    """An episode report's size in the reflection queue, near enough: its texts."""
    return len(report.task_description) + sum(len(t) for t in report.observations) + sum(len(t) for t in report.actions)


def reflection_messages(report: EpisodeReport, mcfg: MemoryServiceConfig, skip: int = 0) -> list[dict]:
    """The chat the policy answers with its reflection (prompts from memory_service config): the
    episode as the agent played it, a user turn per state and an assistant turn per action, then the
    final score and the instruction. The last reflection_steps_shown steps (0: all), less the `skip`
    oldest of those (reflection_prompt fits the prompt to its budget so); the first user turn says
    how many earlier steps are left out."""
    steps = list(zip(report.observations, report.actions))
    if mcfg.reflection_steps_shown > 0:
        steps = steps[-mcfg.reflection_steps_shown :]
    steps = steps[min(skip, len(steps)) :]
    hidden = len(report.actions) - len(steps)
    cap = mcfg.reflection_state_chars

    def state(obs: str) -> str:
        return obs.strip()[:cap] if cap > 0 else obs.strip()

    opening = f"Task: {report.task_description}"
    if hidden:
        opening += f"\n\n(The first {hidden} of the attempt's {len(report.actions)} steps are not shown.)"
    messages = [{"role": "system", "content": mcfg.reflection_system}]
    for i, (obs, action) in enumerate(steps):
        messages.append({"role": "user", "content": f"{opening}\n\n{state(obs)}" if i == 0 else state(obs)})
        messages.append({"role": "assistant", "content": action})
    closing = f"The attempt ended with the final score {report.score:.0f}/100.\n\n{mcfg.reflection_instruction}"
    messages.append({"role": "user", "content": closing if steps else f"{opening}\n\n{closing}"})
    return messages


def reflection_prompt(
    report: EpisodeReport, mcfg: MemoryServiceConfig, tokenizer, max_prompt_tokens: int
) -> tuple[np.ndarray, int]:
    """(prompt token ids, steps left out to fit): the reflection chat, chat-templated, with the
    fewest oldest steps dropped that bring it within `max_prompt_tokens` (all of them if even the
    task and the score alone do not fit: that prompt is sent as it is)."""

    def encode(skip: int) -> list[int]:
        text = tokenizer.apply_chat_template(
            reflection_messages(report, mcfg, skip), tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    ids = encode(0)
    low, high = 0, len(report.actions)  # the smallest skip that fits lies in (low, high]
    if len(ids) > max_prompt_tokens:
        while high - low > 1:  # the length falls as steps are dropped: bisect
            mid = (low + high) // 2
            if len(encode(mid)) <= max_prompt_tokens:
                high = mid
            else:
                low = mid
        skip = high
        ids = encode(skip)
    else:
        skip = 0
    return np.asarray(ids, dtype=np.int32), skip


_TIP_ACTION = " The action you took was "


def tip_text(reflection: str, action: str, score: float) -> str:
    return f"{reflection.strip()}{_TIP_ACTION}{action}; eventually you got score {score:.0f}/100."


def tip_action(tip: str) -> str | None:
    """The step's action a tip names (tip_text's second part), None for a text not made by tip_text."""
    _, found, rest = tip.rpartition(_TIP_ACTION)
    return rest.rsplit("; eventually you got score ", 1)[0] if found else None


def reflection_of(tip: str) -> str:
    """The reflection a tip starts with (tip_text's first part): the entries of one episode share it."""
    return tip.rsplit(_TIP_ACTION, 1)[0]


class MemoryService:
    def __init__(self, memory_service: MemoryServiceConfig, run: RunFacts, sge: SgeConfig | None = None):
        self.mcfg, self.run_facts, self.sge = memory_service, run, sge or SgeConfig()
        self.metrics = MemoryServiceMetrics()
        self.store = MemoryStore(run.run_path(self.mcfg.db_file), self.mcfg.capacity)
        self.strategies = StrategyStore(run.run_path(self.mcfg.db_file), self.mcfg.capacity)
        self.metrics.strategies.set(self.strategies.count())
        self.embedder = Embedder(
            self.mcfg.embedder,
            self.mcfg.embedding_cache,
            self.count_embedding,
            self.mcfg.embedding_max_tokens,
            uses_bf16(self.mcfg.embedding_dtype),
        )
        # One BLAS thread for the vector search: with two, OpenBLAS's spinning threads fight torch's
        # embedding threads for the cores (benchmarks/memory_retrieval.py: queries slower with two).
        threadpool_limits(limits=1, user_api="blas")
        # (pending id in the store, report): what the reflection worker takes; the store holds the same
        self.reports: queue.Queue[tuple[int, EpisodeReport]] = queue.Queue()
        self.limits = run.door  # every message is checked against these (common/server.py)
        self.queued_bytes = 0  # report_bytes of the queued reports: bounded by security.max_reflection_queue_bytes
        self.queue_lock = threading.Lock()
        self.labelled: set[str] = set()  # memories with a metric label of their own (MAX_LABELLED_MEMORIES)
        self.resume_reports()
        # the reflection prompt's token budget: what the policy server's context leaves to it
        self.prompt_budget = self.mcfg.reflection_prompt_budget(run.max_model_len)
        memories, entries = self.store.stats()
        self.metrics.memories.set(memories)
        self.metrics.entries.set(entries)
        log.info("memory store %s: %d entries in %d memories", run.run_path(self.mcfg.db_file), entries, memories)
        if self.store.unusable_rows:
            self.metrics.errors.labels("unusable_stored_row").inc(self.store.unusable_rows)
            log.warning("dropped %d stored entries without a finite score or text", self.store.unusable_rows)
        self.handlers = {  # what this server answers (common/server.py: anything else is an unexpected kind)
            Ping: self.ping,
            MemoryQuery: self.retrieve,
            EpisodeReport: self.queue_report,
            StrategyQuery: self.reflect_strategies,
        }

    # ---------------------------------------------------------------- request loop (main thread)
    def run(self) -> None:
        threading.Thread(target=self._reflection_worker, name="reflection", daemon=True).start()
        log.info("memory service on %s", self.run_facts.endpoints.memory_service)
        serve_requests(
            self.run_facts.endpoints.bind_address(self.run_facts.endpoints.memory_service),
            self.handlers,
            self.metrics,
            self.limits,
            batched={MemoryQuery: self.retrieve_batch},
            max_batch=self.mcfg.query_batch,
        )

    def close(self) -> None:
        self.store.close()
        self.strategies.close()

    def ping(self, msg: Ping) -> Pong:
        return Pong(role="memory_service", policy_version=-1, ready=True, uptime_s=process_uptime_s())

    def resume_reports(self) -> None:
        """Queue again every report a previous run acknowledged and did not reflect on."""
        pending = self.store.pending_reports()
        for report_id, record in pending:
            try:
                report = decode(unpack_frames(record))
            except (ProtocolError, ValueError) as exc:  # a record this version cannot read: not a reason to stop
                log.warning("queued report %d cannot be decoded (%s); given up", report_id, str(exc)[:200])
                self.store.report_failed(report_id, max_attempts=0)
                self.metrics.reports_given_up.inc()
                continue
            self.queued_bytes += report_bytes(report)  # taken before the restart: counted, never refused
            self.reports.put((report_id, report))
        self.metrics.reflection_queue.set(self.reports.qsize())
        if pending:
            log.info("resuming %d episode reports queued before the restart", len(pending))

    def admit_report(self, report: EpisodeReport) -> bool:
        """Room in the reflection queue for this report (security.max_reflection_queue_bytes)? Takes it."""
        size = report_bytes(report)
        with self.queue_lock:
            if self.queued_bytes + size > self.run_facts.security.max_reflection_queue_bytes:
                return False
            self.queued_bytes += size
        return True

    def release_report(self, report: EpisodeReport) -> None:
        with self.queue_lock:
            self.queued_bytes -= report_bytes(report)

    def queue_report(self, report: EpisodeReport) -> Ack | Wait:
        """Persisted in the store's queue before the Ack; the reflection worker reflects on it and
        stores its entries later. A full queue (in bytes) answers Wait: the actor's report is not
        taken. A report of an episode already queued is acknowledged and not queued twice. SGE: its
        strategy is stored first; with reflect=false that is all."""
        if report.strategy and self.strategies.add(
            report.episode_id, report.task, report.variation, report.strategy, report.score, report.strategy_temperature
        ):
            self.metrics.strategies.inc()
        if not report.reflect:
            return Ack(ref=report.episode_id, detail="strategy stored" if report.strategy else "nothing to store")
        if not self.admit_report(report):
            self.metrics.rejected.labels("queue_full").inc()
            return Wait(retry_after_s=REPORT_RETRY_S, reason="the reflection queue is full")
        report_id = self.store.queue_report(report.episode_id, pack_frames(encode(report)))
        if report_id is None:
            self.release_report(report)
            self.metrics.reports_duplicate.inc()
            return Ack(ref=report.episode_id, detail="already queued for reflection", duplicate=True)
        self.reports.put((report_id, report))
        self.metrics.reflection_queue.set(self.reports.qsize())
        return Ack(ref=report.episode_id, detail="queued for reflection")

    def retrieve(self, query: MemoryQuery) -> MemoryResult:
        return self.retrieve_batch([query])[0]

    def retrieve_batch(self, queries: list[MemoryQuery]) -> list[MemoryResult]:
        """The queries waiting together (memory_service.query_batch), their states embedded in one call."""
        vectors = self.embed([key_text(self.mcfg.state_key, q.state, q.inventory) for q in queries])
        results = []
        for query, vector in zip(queries, vectors):
            key = memory_key(self.mcfg.key, query.task, query.variation)
            hits = self.store.retrieve(key, vector, self.mcfg.similarity_threshold, self.mcfg.top_k)
            self.metrics.hits.observe(len(hits))
            self.metrics.distinct_reflections.observe(len({reflection_of(e.tip) for e, _ in hits}))
            results.append(
                MemoryResult(tips=[e.tip for e, _ in hits], scores=[e.score for e, _ in hits], count=len(hits))
            )
        self.metrics.retrievals.inc(len(queries))
        return results

    def reflect_strategies(self, query: StrategyQuery) -> StrategyResult:
        """SGE's reflection for a group: the first member's answer is kept for the others."""
        shown = self.strategies.reflection(
            query.group_id, query.task, self.sge.reflection_best, self.sge.reflection_recent
        )
        self.metrics.strategy_reflections.inc()
        return StrategyResult(strategies=[s for s, _ in shown], scores=[score for _, score in shown])

    # ------------------------------------------------------------ reflection (worker thread)
    def _reflection_worker(self) -> None:
        """Drain up to reflection_batch_size reports, ask the policy for all reflections at once
        (one in-flight request per client, spread over the servers), embed every state of the
        batch in one call, store. One failed reflection loses that episode's tips, nothing else."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model(self.run_facts.model.name, self.run_facts.model.cache_dir or None)
        )
        ctx, servers = zmq.Context.instance(), self.run_facts.endpoints.policy_servers
        clients = [
            Client(ctx, servers[i % len(servers)], self.mcfg.reflection_timeout_s)
            for i in range(self.mcfg.reflection_batch_size)
        ]
        request_ids = itertools.count()
        while True:
            reports = [self.reports.get()]
            while len(reports) < len(clients) and not self.reports.empty():
                reports.append(self.reports.get_nowait())
            for _, report in reports:
                self.release_report(report)
            self.metrics.reflection_queue.set(self.reports.qsize())
            self.metrics.reflection_batch.observe(len(reports))
            t0 = time.perf_counter()
            for client, (_, report) in zip(clients, reports):
                prompt_ids, dropped = reflection_prompt(report, self.mcfg, tokenizer, self.prompt_budget)
                if dropped:
                    log.info(
                        "episode %s: reflection prompt over %d tokens; its %d oldest steps left out",
                        short_id(report.episode_id),
                        self.prompt_budget,
                        dropped,
                    )
                rid = next(request_ids)
                client.send(
                    GenerateRequest(
                        request_id=f"reflect-{rid}",
                        prompt_token_ids=prompt_ids,
                        max_tokens=self.mcfg.reflection_max_tokens,
                        temperature=self.mcfg.reflection_temperature,
                        seed=rid,
                    )
                )
            reflected, not_ready = [], False
            for client, (report_id, report) in zip(clients, reports):
                try:
                    response = client.recv()
                except RemoteError as exc:
                    if exc.reason == "not_ready":  # the engine is still loading: not a failed attempt
                        self.reports.put((report_id, report))
                        not_ready = True
                    else:
                        self.reflection_failed(report_id, report)
                    continue
                except RequestLost as exc:  # the policy server restarted: not the report's failed attempt
                    log.warning("episode %s: %s; its reflection is asked again", short_id(report.episode_id), exc)
                    self.reports.put((report_id, report))
                    continue
                except Exception:
                    self.reflection_failed(report_id, report)
                    continue
                self.metrics.policy_version.set(response.policy_version)
                reflected.append((report_id, report, response.text))
            if reflected:
                self.store_reflections(reflected)
            for _ in reflected:
                self.metrics.reflection_seconds.observe(time.perf_counter() - t0)
            if not_ready:
                time.sleep(NOT_READY_RETRY_S)

    def embed(self, texts: list[str]) -> np.ndarray:
        self.metrics.embedding_batch.observe(len(texts))
        return self.embedder.embed(texts)

    def count_embedding(self, embedded: int, from_cache: int) -> None:
        self.metrics.embedding_cache.labels("miss").inc(embedded)
        self.metrics.embedding_cache.labels("hit").inc(from_cache)

    def reflection_failed(self, report_id: int, report: EpisodeReport) -> None:
        """A failed reflection (timeout, error reply): the report goes to the back of the queue,
        or after reflection_attempts failures is given up (its tips are lost; counted)."""
        self.metrics.errors.labels("reflection").inc()
        log.exception("reflection for episode %s failed", report.episode_id)
        if self.store.report_failed(report_id, self.mcfg.reflection_attempts):
            self.reports.put((report_id, report))
        else:
            self.metrics.reports_given_up.inc()
            log.warning(
                "episode %s: no reflection after %d attempts; its report is given up",
                short_id(report.episode_id),
                self.mcfg.reflection_attempts,
            )

    def store_reflections(self, reflected: list[tuple[int, EpisodeReport, str]]) -> int:
        """One entry per step of each episode: tip (reflection + action + score), keyed by the state;
        each report leaves the persisted queue (its pending id) in the transaction of its entries."""
        vectors = self.embed(
            [
                key_text(self.mcfg.state_key, state, inventory)
                for _, report, _ in reflected
                for state, inventory in zip(report.observations, report.inventories or [""] * len(report.observations))
            ]
        )
        added, offset = 0, 0
        for report_id, report, reflection in reflected:
            reflection = " ".join(reflection.split())[: self.run_facts.security.max_reflection_len]
            reflection = reflection or "No reflection was produced."
            n = len(report.observations)
            entries = [
                Entry(tip_text(reflection, a, report.score), report.score, s)
                for a, s in zip(report.actions, report.observations)
            ]
            key = memory_key(self.mcfg.key, report.task, report.variation)
            added += self.store.add(key, entries, vectors[offset : offset + n], done_report=report_id)
            offset += n
            if key in self.labelled or len(self.labelled) < MAX_LABELLED_MEMORIES:
                self.labelled.add(key)
                self.metrics.memory_entries.labels(key).set(self.store.size(key))
            else:
                others = [k for k in list(self.store.memories) if k not in self.labelled]
                self.metrics.memory_entries.labels("other").set(sum(self.store.size(k) for k in others))
            log.info(
                "episode %s: reflection stored (%d steps): %r",
                short_id(report.episode_id),
                n,
                reflection[:LOGGED_REFLECTION_CHARS],
            )
        memories, total = self.store.stats()
        self.metrics.reflections.inc(len(reflected))
        self.metrics.memories.set(memories)
        self.metrics.entries.set(total)
        return added


def main(memory_service: MemoryServiceConfig, sge: SgeConfig, run: RunFacts) -> None:
    run_role("memory_service", run, lambda: MemoryService(memory_service, run, sge))
