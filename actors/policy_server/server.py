"""Policy server: a vLLM engine behind a ZeroMQ ROUTER.

Socket: ROUTER bound at endpoints.policy_servers[index].
  in : Ping, GenerateRequest (env actors, memory service),
       WeightChunk | WeightFile | NcclTransferInit | NcclTransferUpdate (learner, by weight_sync.method)
  out: Pong, GenerateResponse, WeightUpdateAck, ErrorReply
Requests are served concurrently (one asyncio task each) and batched continuously by the
engine; a weight update is applied atomically between generations (actors/policy_server/engine.py).

Run: `empo2-policy-server policy_server.index=0 [key=value ...]` (see README, "Processes").
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import zmq
import zmq.asyncio

from actors.policy_server.config import PolicyServerConfig
from actors.policy_server.weight_receiver import WeightAssembler, WeightUpdateError, remove_dead_staged_files
from common.config import RunFacts, WeightSyncConfig
from common.heartbeat import HEARTBEAT, beat
from common.logs import setup_logging
from common.metrics import PolicyServerMetrics
from common.model_prep import model_vocab_size, resolve_model
from common.process import run_async_until_signalled
from common.server import dispatch, rejections
from protocol import ProtocolError, decode, encode
from protocol.messages import (
    ErrorReply,
    GenerateRequest,
    GenerateResponse,
    NcclTransferInit,
    NcclTransferUpdate,
    Ping,
    Pong,
    WeightChunk,
    WeightFile,
    WeightUpdateAck,
)
from protocol.newest_version import read_newest_version
from protocol.security import secure_server, sender_role, watch_handshakes
from protocol.transport import process_uptime_s
from protocol.weight_file import file_checksum, shared_lock

log = logging.getLogger("policy_server")

# An ErrorReply carries the start of the exception text, a hint for the client's log; the
# traceback is in this server's log (an exception from vLLM can be kilobytes long).
ERROR_DETAIL_CHARS = 500
# How often an idle server beats (common/heartbeat.py): idle is fine; work in flight with no
# completion is not, and a stopped event loop or a hung engine core writes nothing.
HEARTBEAT_TICK_S = 1.0


class PolicyServer:
    def __init__(self, policy_server: PolicyServerConfig, weight_sync: WeightSyncConfig, run: RunFacts):
        self.scfg, self.weight_sync, self.run_facts = policy_server, weight_sync, run
        self.index = index = policy_server.index
        self.bind_address = run.endpoints.bind_address(run.endpoints.policy_servers[index])
        self.metrics = PolicyServerMetrics()
        self.metrics.policy_version.set(-1)  # no engine yet
        self.engine = None  # created in run(): the socket answers Ping (ready=False) meanwhile
        for path in remove_dead_staged_files(self.scfg.weight_staging_dir):  # what a killed predecessor left
            log.info("removed %s, staged by a policy server that is gone", path)
        self.assembler = WeightAssembler(self.scfg.weight_staging_dir, f"{os.getpid()}-{index}")
        # WeightFile paths are read only from these (weight_sync.method=shm: /dev/shm; =checkpoint: this run's checkpoints)
        self.weight_dirs = [os.path.realpath(d) for d in [*self.scfg.allowed_weight_dirs, run.run_path("checkpoints")]]
        self.tasks: set[asyncio.Task] = set()
        self.busy = 0  # generations and weight loads in the engine: while > 0 only a completion beats
        # vLLM's engine core died (EngineDeadError): every later request would fail, so the server
        # ends with an error and its supervisor (deploy/launch.py, systemd) starts a fresh one
        self.engine_dead = False
        self.limits = None  # set in run(), before the engine: what every request is checked against
        # started into a run whose learner has published a newer version than the engine loads (a
        # restart): no generation until a weight update arrives, so no episode is played by the base
        # model; the learner sees it in the Pong and pushes the newest weights here (catch-up)
        self.awaiting_version = 0
        self.generated = False  # any generation answered since start
        # message type -> handler(msg, identity) (common/server.py: anything else is an unexpected kind).
        # A handler returns its reply, or None when it answers itself: weight chunks are staged in the
        # receive loop, in order; generations, weight files and NCCL transfers each run in a task.
        self.handlers = {
            Ping: self._ping,
            GenerateRequest: self._in_task(self._generate),
            WeightChunk: self._weight_chunk,
            WeightFile: self._in_task(self._weight_file),
            NcclTransferInit: self._in_task(self._nccl_transfer),
            NcclTransferUpdate: self._in_task(self._nccl_transfer),
        }

    async def run(self) -> None:
        ctx = zmq.asyncio.Context()
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, self.scfg.max_weight_message_bytes)
        secure_server(self.sock)  # CURVE + ZAP when security.curve (protocol/security.py): weight pushes too
        watch_handshakes(self.sock, self.metrics.handshake_failures)
        self.sock.bind(self.bind_address)
        log.info("policy server %d listening on %s", self.index, self.bind_address)
        recv_loop = self._recv_task = asyncio.create_task(self._recv_loop())
        model = self.run_facts.model
        model_path = resolve_model(model.name, model.cache_dir or None)
        self.limits = replace(self.run_facts.door, vocab_size=model_vocab_size(model_path))  # token ids < its vocab
        # an unfinished zmq update holds at most twice the model's weights (a learner in float32 pushing
        # to a bfloat16 server sends twice the bytes of its files)
        self.assembler.max_bytes = 2 * sum(f.stat().st_size for f in Path(model_path).glob("*.safetensors"))
        from actors.policy_server.engine import PolicyEngine  # late: importing vLLM takes seconds

        t0 = time.time()
        self.engine = await asyncio.to_thread(
            PolicyEngine, model_path, self.scfg, self.run_facts.seed + self.index, self.weight_sync.method
        )
        self.awaiting_version = self.version_to_await()
        if self.awaiting_version:
            log.info(
                "the run is at policy version %d: no generation until the learner pushes it here", self.awaiting_version
            )
        self.metrics.ready.set(1)
        self.metrics.policy_version.set(self.engine.version)
        log.info("engine ready in %.1fs, loaded policy version %d", time.time() - t0, self.engine.version)
        heartbeat = asyncio.create_task(self._heartbeat())  # from now on: the engine's start is start-up
        try:
            await recv_loop
        finally:
            heartbeat.cancel()

    def version_to_await(self) -> int:
        """The run's newest version if it is ahead of the engine's weights and this server waits for
        it (policy_server.await_newest_version: a training run's server); else 0."""
        if not self.scfg.await_newest_version:
            return 0
        newest = read_newest_version(self.run_facts.run_dir)
        return newest if newest > self.engine.version else 0

    async def _heartbeat(self) -> None:
        """Beat while idle; with work in the engine only its completions beat (_engine_work)."""
        while True:
            if not self.busy:
                beat()
            await asyncio.sleep(HEARTBEAT_TICK_S)

    @contextlib.asynccontextmanager
    async def _engine_work(self):
        """Work of the engine's: counted busy while it runs; its end, failed or not, is progress."""
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1
            beat()

    async def _recv_loop(self) -> None:
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            identity, body = frames[0].bytes, frames[1:]
            try:
                msg = decode(body, self.scfg.max_weight_message_bytes)
                if (
                    not isinstance(msg, WeightChunk)
                    and sum(len(f.buffer) for f in body) > self.scfg.max_request_message_bytes
                ):
                    raise ProtocolError("too_large", f"{msg.KIND} over {self.scfg.max_request_message_bytes} bytes")
            except ProtocolError as exc:
                self.metrics.rejected.labels(exc.reason).inc()
                rejections.note(exc)
                await self._send(identity, ErrorReply(reason=exc.reason, detail=str(exc)[:ERROR_DETAIL_CHARS]))
                continue
            self.metrics.messages_in.labels(msg.KIND).inc()
            if self.engine is None and not isinstance(msg, Ping):
                await self._send(identity, ErrorReply(reason="not_ready", detail="engine still starting"))
                continue
            reply = dispatch(
                self.handlers, msg, self.metrics, identity, limits=self.limits, sender=sender_role(body[0])
            )
            if inspect.isawaitable(reply):
                reply = await reply
            if reply is not None:
                await self._send(identity, reply)

    def _in_task(self, handler):
        """A handler that serves its request in a task of its own and answers when done: the
        receive loop goes on at once (generations run concurrently, batched by the engine)."""
        return lambda msg, identity: self._spawn(handler(msg, identity))

    def _ping(self, msg: Ping, identity: bytes) -> Pong:
        version = self.engine.version if self.engine else -1
        return Pong(
            role="policy_server",
            policy_version=version,
            ready=self.engine is not None,
            awaiting_version=self.awaiting_version,
            uptime_s=process_uptime_s(),
        )

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _stop_if_engine_dead(self, exc: Exception) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError  # vLLM is loaded once an engine ran

        if isinstance(exc, EngineDeadError) and not self.engine_dead:
            self.engine_dead = True
            log.error("vLLM's engine core died (traceback above): stopping so that a fresh server is started")
            self._recv_task.cancel()

    async def _send(self, identity: bytes, msg) -> None:
        await self.sock.send_multipart([identity, *encode(msg)], copy=False)
        self.metrics.messages_out.labels(msg.KIND).inc()

    async def _generate(self, req: GenerateRequest, identity: bytes) -> None:
        if self.awaiting_version:
            detail = f"waiting for the run's policy version {self.awaiting_version} (loaded: {self.engine.version})"
            await self._send(identity, ErrorReply(reason="not_ready", detail=detail))
            return
        self.metrics.requests_in_flight.inc()
        t0 = time.perf_counter()
        try:
            async with self._engine_work():
                out = await self.engine.generate(req)
            self.metrics.generated_tokens.inc(len(out.token_ids))
            self.metrics.requests_retried.inc(out.retries)
            self.metrics.prompt_tokens.inc(out.prompt_tokens)
            self.metrics.request_latency.observe(time.perf_counter() - t0)
            if not self.generated:  # what a restart's first episode turn was played by
                self.generated = True
                log.info("first generation since start, at policy version %d", out.policy_version)
            await self._send(
                identity,
                GenerateResponse(
                    request_id=req.request_id,
                    token_ids=out.token_ids,
                    logprobs=out.logprobs,
                    text=out.text,
                    policy_version=out.policy_version,
                    finish_reason=out.finish_reason,
                    temperature=out.temperature,
                ),
            )
        except Exception as exc:  # one bad request must not take the server down
            self.metrics.errors.labels("generate").inc()
            log.exception("generation %s failed", req.request_id)
            await self._send(identity, ErrorReply(reason="generate_failed", detail=str(exc)[:ERROR_DETAIL_CHARS]))
            self._stop_if_engine_dead(exc)
        finally:
            self.metrics.requests_in_flight.dec()

    async def _weight_chunk(self, chunk: WeightChunk, identity: bytes) -> None:
        if chunk.chunk_index == 0:
            self._update_t0 = time.perf_counter()
        self.metrics.weight_update_bytes.inc(sum(d.nbytes for d in chunk.data))
        try:
            staged = self.assembler.add(chunk)
        except WeightUpdateError as exc:
            self.metrics.rejected.labels("weight_checksum").inc()
            await self._send(identity, ErrorReply(reason="weight_update_rejected", detail=str(exc)))
            return
        if staged is None:
            await self._send(
                identity, WeightUpdateAck(version=self.engine.version, chunk_index=chunk.chunk_index, applied=False)
            )
            return
        self._spawn(
            self._apply(
                identity, chunk.version, chunk.chunk_index, staged, self._update_t0, chunk.lora_scale, remove_after=True
            )
        )

    async def _weight_file(self, update: WeightFile, identity: bytes) -> None:
        """Verify the file's checksum (off the event loop: it reads every byte), then apply it
        in place: no copy through the socket or a staging file. The file is held against rewrites
        (a shared flock, protocol/weight_file.py) from the checksum until the engine has loaded it."""
        t0 = time.perf_counter()
        real = os.path.realpath(update.path)
        if not any(real.startswith(d + os.sep) for d in self.weight_dirs):
            self.metrics.rejected.labels("weight_path").inc()
            await self._send(
                identity,
                ErrorReply(
                    reason="weight_update_rejected",
                    detail=f"{update.path} is outside policy_server.allowed_weight_dirs and the run's checkpoints",
                ),
            )
            return
        with contextlib.ExitStack() as held:
            try:
                await asyncio.to_thread(held.enter_context, shared_lock(real))  # waits out a rewrite in progress
                actual = await asyncio.to_thread(file_checksum, real)
            except OSError as exc:
                actual = f"unreadable ({exc})"
            if actual != update.checksum:
                self.metrics.rejected.labels("weight_checksum").inc()
                await self._send(
                    identity,
                    ErrorReply(
                        reason="weight_update_rejected",
                        detail=f"v{update.version}: checksum {actual} != {update.checksum}",
                    ),
                )
                return
            self.metrics.weight_update_bytes.inc(os.path.getsize(real))
            await self._apply(identity, update.version, 0, real, t0, update.lora_scale)

    async def _nccl_transfer(self, msg: NcclTransferInit | NcclTransferUpdate, identity: bytes) -> None:
        """weight_sync.method=nccl: the learner's vLLM trainer engine drives these; the tensors
        arrive over NCCL while the request is open (the engine refused to start without a GPU)."""
        t0 = time.perf_counter()
        try:
            if isinstance(msg, NcclTransferInit):
                await self.engine.init_weight_transfer(vars(msg))
                await self._send(identity, WeightUpdateAck(version=self.engine.version, chunk_index=0, applied=False))
                return
            update = {"names": msg.names, "dtype_names": msg.dtype_names, "shapes": msg.shapes}
            async with self._engine_work():
                await self.engine.receive_weights(update, msg.version)
        except Exception as exc:
            self.metrics.errors.labels("weight_update").inc()
            log.exception("NCCL weight transfer (%s) failed", msg.KIND)
            await self._send(identity, ErrorReply(reason="weight_update_failed", detail=str(exc)[:ERROR_DETAIL_CHARS]))
            self._stop_if_engine_dead(exc)
            return
        await self._updated(identity, msg.version, 0, time.perf_counter() - t0, t0)

    async def _apply(
        self,
        identity: bytes,
        version: int,
        chunk_index: int,
        path: str,
        t0: float,
        lora_scale: float = 0.0,
        remove_after: bool = False,
    ) -> None:
        """Load the weights at `path` into the engine; a file this server staged itself is deleted
        afterwards (the engine holds the tensors now; in /dev/shm it would hold ~0.5 GB of RAM)."""
        t_apply = time.perf_counter()
        try:
            async with self._engine_work():
                await self.engine.load_weights(path, version, lora_scale)
        except Exception as exc:
            self.metrics.errors.labels("weight_update").inc()
            log.exception("applying weights v%d failed", version)
            await self._send(identity, ErrorReply(reason="weight_update_failed", detail=str(exc)[:ERROR_DETAIL_CHARS]))
            self._stop_if_engine_dead(exc)
            return
        finally:
            if remove_after:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
        await self._updated(identity, version, chunk_index, time.perf_counter() - t_apply, t0)

    async def _updated(self, identity: bytes, version: int, chunk_index: int, apply_s: float, t0: float) -> None:
        self.metrics.weight_updates.inc()
        self.metrics.weight_update_seconds.observe(time.perf_counter() - t0)
        self.metrics.policy_version.set(version)
        log.info("policy version %d live (reload %.2fs)", version, apply_s)
        if self.awaiting_version:  # any update lifts the wait: the learner's weights are the run's newest
            log.info("serving generations again, at policy version %d", version)
            self.awaiting_version = 0
        await self._send(
            identity, WeightUpdateAck(version=version, chunk_index=chunk_index, applied=True, apply_seconds=apply_s)
        )


def main(policy_server: PolicyServerConfig, weight_sync: WeightSyncConfig, run: RunFacts) -> None:
    setup_logging(f"policy_server{policy_server.index}")
    HEARTBEAT.start(run.heartbeat_path)
    server = PolicyServer(policy_server, weight_sync, run)
    server.metrics.serve(run.metrics.host, run.metrics_port)
    run_async_until_signalled(server.run(), on_exit=lambda: server.engine and server.engine.shutdown())
    if server.engine_dead:
        sys.exit(1)
