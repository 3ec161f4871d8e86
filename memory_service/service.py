"""Memory service: the current policy reflects on finished episodes; tips are stored and served.

Socket: ROUTER bound at endpoints.memory_service.
  in : Ping, MemoryQuery (env actors), EpisodeReport (env actors)
  out: Pong, MemoryResult, Ack, ErrorReply
Client: DEALER to the policy servers (GenerateRequest for reflections, round-robin).

Episode reports are acknowledged at once and queued; a worker thread asks the policy for the
reflection, embeds the episode's states and stores one entry per step. Actors never wait on it.

Run: `empo2-memory-service [key=value ...]`.
"""

from __future__ import annotations

import itertools
import logging
import queue
import sys
import threading
import time

import numpy as np
import zmq

from common.config import PipelineConfig, load_config
from common.logs import setup_logging
from common.metrics import MemoryServiceMetrics
from common.model_prep import resolve_model
from common.process import exit_on_sigterm
from memory_service.embedder import Embedder
from memory_service.store import Entry, MemoryStore, memory_key
from protocol import Client, ProtocolError, bind_router, recv_request, send_reply
from protocol.messages import Ack, EpisodeReport, ErrorReply, GenerateRequest, MemoryQuery, MemoryResult, Ping, Pong

log = logging.getLogger("memory_service")

REFLECTION_SYSTEM = "You review an agent's attempt at a ScienceWorld task and write one short lesson for its next attempt."
REFLECTION_INSTRUCTION = (
    "In one sentence of under 100 words, say what happened in this attempt, how far it was from "
    "completing the task, and what to do differently next time."
)


def reflection_messages(report: EpisodeReport, max_steps_shown: int = 12) -> list[dict]:
    steps = list(zip(report.actions, report.observations))[-max_steps_shown:]
    lines = "\n".join(f"{i + 1}. state: {obs.strip()[:160]!r} -> action: {act}" for i, (act, obs) in enumerate(steps))
    user = f"Task: {report.task_description}\nAttempt:\n{lines}\nFinal score: {report.score:.0f}/100.\n\n{REFLECTION_INSTRUCTION}"
    return [{"role": "system", "content": REFLECTION_SYSTEM}, {"role": "user", "content": user}]


def tip_text(reflection: str, action: str, score: float) -> str:
    return f"{reflection.strip()} The action you took was {action}; eventually you got score {score:.0f}/100."


class MemoryService:
    def __init__(self, cfg: PipelineConfig):
        self.cfg, self.mcfg = cfg, cfg.memory_service
        self.metrics = MemoryServiceMetrics()
        self.store = MemoryStore(cfg.run_path(self.mcfg.db_file), self.mcfg.capacity)
        self.embedder = Embedder(self.mcfg.embedder)
        self.reports: queue.Queue[EpisodeReport] = queue.Queue()
        memories, entries = self.store.stats()
        self.metrics.memories.set(memories)
        self.metrics.entries.set(entries)
        log.info("memory store %s: %d entries in %d memories", cfg.run_path(self.mcfg.db_file), entries, memories)

    # ---------------------------------------------------------------- request loop (main thread)
    def run(self) -> None:
        threading.Thread(target=self._reflection_worker, name="reflection", daemon=True).start()
        sock = bind_router(zmq.Context.instance(), self.cfg.endpoints.memory_service)
        log.info("memory service on %s", self.cfg.endpoints.memory_service)
        while True:
            try:
                request = recv_request(sock)
            except ProtocolError as exc:
                self.metrics.rejected.labels(exc.reason).inc()
                log.warning("rejected message: %s", exc)
                continue
            msg = request.message
            self.metrics.messages_in.labels(msg.KIND).inc()
            reply = self.handle(msg)
            send_reply(sock, request.identity, reply)
            self.metrics.messages_out.labels(reply.KIND).inc()

    def handle(self, msg):
        if isinstance(msg, Ping):
            return Pong(role="memory_service", policy_version=-1, ready=True)
        if isinstance(msg, MemoryQuery):
            return self.retrieve(msg)
        if isinstance(msg, EpisodeReport):
            self.reports.put(msg)
            self.metrics.reflection_queue.set(self.reports.qsize())
            return Ack(ref=msg.episode_id, detail="queued for reflection")
        self.metrics.rejected.labels("unexpected_kind").inc()
        return ErrorReply(reason="unexpected_kind", detail=f"{msg.KIND} is not served here")

    def retrieve(self, query: MemoryQuery) -> MemoryResult:
        key = memory_key(self.mcfg.key, query.task, query.variation)
        vector = self.embedder.embed([query.state])[0]
        hits = self.store.retrieve(key, vector, self.mcfg.similarity_threshold, self.mcfg.top_k)
        self.metrics.retrievals.inc()
        self.metrics.hits.observe(len(hits))
        return MemoryResult(tips=[e.tip for e, _ in hits], scores=[e.score for e, _ in hits], count=len(hits))

    # ------------------------------------------------------------ reflection (worker thread)
    def _reflection_worker(self) -> None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.cfg.model.name, self.cfg.model.cache_dir or None))
        ctx = zmq.Context.instance()
        policies = itertools.cycle(
            [Client(ctx, ep, self.mcfg.reflection_timeout_s) for ep in self.cfg.endpoints.policy_servers]
        )
        request_ids = itertools.count()
        while True:
            report = self.reports.get()
            self.metrics.reflection_queue.set(self.reports.qsize())
            t0 = time.perf_counter()
            try:
                text = tokenizer.apply_chat_template(reflection_messages(report), tokenize=False, add_generation_prompt=True)
                prompt = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int32)
                response = next(policies).call(GenerateRequest(
                    request_id=f"reflect-{next(request_ids)}", prompt_token_ids=prompt,
                    max_tokens=self.mcfg.reflection_max_tokens, temperature=self.mcfg.reflection_temperature,
                    seed=next(request_ids),
                ))
                self.metrics.policy_version.set(response.policy_version)
                self.store_reflection(report, response.text)
            except Exception:  # a failed reflection loses one episode's tips, never the service
                self.metrics.errors.labels("reflection").inc()
                log.exception("reflection for episode %s failed", report.episode_id)
                continue
            self.metrics.reflection_seconds.observe(time.perf_counter() - t0)

    def store_reflection(self, report: EpisodeReport, reflection: str) -> int:
        reflection = " ".join(reflection.split()) or "No reflection was produced."
        entries = [Entry(tip_text(reflection, a, report.score), report.score, s) for a, s in zip(report.actions, report.observations)]
        added = self.store.add(memory_key(self.mcfg.key, report.task, report.variation), entries, self.embedder.embed(report.observations))
        memories, total = self.store.stats()
        self.metrics.reflections.inc()
        self.metrics.memories.set(memories)
        self.metrics.entries.set(total)
        log.info("episode %s: reflection stored as %d new entries (%d total): %r", report.episode_id[:8], added, total, reflection[:120])
        return added


def main(argv: list[str] | None = None) -> None:
    cfg = load_config(sys.argv[1:] if argv is None else argv)
    setup_logging("memory_service")
    exit_on_sigterm()
    service = MemoryService(cfg)
    service.metrics.serve(cfg.metrics.host, cfg.metrics.port("memory_service"))
    try:
        service.run()
    except (KeyboardInterrupt, SystemExit):
        log.info("stopping")
    finally:
        service.store.close()


if __name__ == "__main__":
    main()
