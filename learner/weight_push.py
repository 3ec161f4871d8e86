"""Push the learner's weights to every policy server, by one of four methods (weight_sync.method):

- "zmq": tensors travel as uint8 views of their memory (zero-copy on CPU) in WeightChunk
  messages of about `zmq_chunk_bytes`, with an XXH3-128 checksum over all bytes; works across hosts.
- "shm": the learner writes one safetensors file in `shm_dir` (/dev/shm: shared memory,
  written once for every server on the host; the same file is rewritten in place at every push,
  protocol/weight_file.py) and sends its path and checksum in a WeightFile message; each server
  verifies it and loads it straight from the mapping. The file is removed when the learner exits.
- "checkpoint": the same WeightFile message naming the model file of the HF checkpoint the
  learner writes at every push (run_dir/checkpoints on a filesystem the servers share).
- "nccl": vLLM's native NCCL weight transfer on GPU hosts: vLLM's trainer engine broadcasts the
  tensors to each server's workers and drives the server through NcclTransferInit/Update
  messages on the usual socket (ZmqWeightSyncClient). Refuses to start without CUDA.
Each server acknowledges; the last ack says the new version is live there. A server that does not
answer within learner.push_timeout_s (hung, e.g. SIGSTOPped) gets the whole update again, up to
learner.push_attempts times in all (a server applies a version it already has again, harmlessly),
then the push fails with an error naming the server, the version and the wait (PushStalled).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import zmq

from common.config import WeightSyncConfig
from common.heartbeat import beat
from learner.checkpoint import model_dir
from learner.lora import adapter_tensors, is_lora
from protocol import Client, RemoteError, RequestTimeout
from protocol.messages import (
    NcclTransferInit,
    NcclTransferUpdate,
    TensorMeta,
    WeightChunk,
    WeightFile,
    WeightUpdateAck,
)
from protocol.weight_file import file_checksum, weights_checksum, write_weight_file

log = logging.getLogger(__name__)


def weight_tensors(model, state_dict: dict[str, torch.Tensor] | None = None) -> list[tuple[str, torch.Tensor]]:
    """HF-named tensors a server needs: the adapter alone for a LoRA policy (learner/lora.py), else
    every weight but a tied lm_head (the server ties it itself). state_dict: the full weights when
    the model is sharded (learner/distributed.py); else its own."""
    if is_lora(model):
        return adapter_tensors(model, state_dict)
    tied = getattr(model.config, "tie_word_embeddings", False)
    state_dict = model.state_dict() if state_dict is None else state_dict
    return [(name, t.detach()) for name, t in state_dict.items() if not (tied and name == "lm_head.weight")]


def build_chunks(
    tensors: list[tuple[str, torch.Tensor]], version: int, chunk_bytes: int, lora_scale: float = 0.0
) -> list[WeightChunk]:
    views = []
    for name, t in tensors:
        cpu = t.to("cpu").contiguous()
        views.append(
            (
                TensorMeta(name, str(cpu.dtype).removeprefix("torch."), list(cpu.shape)),
                cpu.view(-1).view(torch.uint8).numpy(),
            )
        )
    checksum = weights_checksum(memoryview(v) for _, v in views)
    groups, current, size = [], [], 0
    for meta, view in views:
        if current and size + view.nbytes > chunk_bytes:
            groups.append(current)
            current, size = [], 0
        current.append((meta, view))
        size += view.nbytes
    groups.append(current)
    return [
        WeightChunk(
            version=version,
            chunk_index=i,
            num_chunks=len(groups),
            tensors=[m for m, _ in g],
            data=[v for _, v in g],
            checksum=checksum,
            lora_scale=lora_scale,
        )
        for i, g in enumerate(groups)
    ]


@dataclass
class PushTiming:
    seconds: float  # wall time from the first byte sent until every server runs the new version
    engine_seconds: float  # the part spent inside the servers' engines loading it (summed over servers)

    @property
    def transport_seconds(self) -> float:
        """Writing, sending, verifying: everything but the engine's own load."""
        return self.seconds - self.engine_seconds


# a server answering not_ready (its engine starting) is sent the update again this often
NOT_READY_RETRY_S = 2.0


class PushStalled(RuntimeError):
    """A policy server did not acknowledge a weight update within the timeout, attempt after attempt."""


def with_retries(client: Client, version: int, timeout_s: float, attempts: int, push_one):
    """push_one(client) (one whole update to it), again after each timeout, `attempts` times in all.
    A server answering not_ready is (re)starting its engine (a restarted server binds its socket
    first): the update is sent again every NOT_READY_RETRY_S, for up to `timeout_s` in all, instead
    of failing the learner. Each attempt is progress of the learner (common/heartbeat.py): a hung
    server is found by its own heartbeat, which is why launch.hang_timeout_s must exceed
    learner.push_timeout_s."""
    attempt, not_ready_until = 1, None
    while True:
        beat()
        try:
            return push_one(client)
        except RemoteError as exc:
            if exc.reason != "not_ready":
                raise
            now = time.monotonic()
            not_ready_until = not_ready_until or now + timeout_s
            if now >= not_ready_until:
                raise PushStalled(
                    f"weight push of v{version} to {client.endpoint}: the server stayed not ready for "
                    f"{timeout_s:.0f}s (learner.push_timeout_s): {exc}"
                ) from exc
            log.info(
                "%s is not ready (%s): sending v%d again in %.0fs", client.endpoint, exc, version, NOT_READY_RETRY_S
            )
            time.sleep(NOT_READY_RETRY_S)
        except RequestTimeout as exc:
            if attempt == attempts:
                raise PushStalled(
                    f"weight push of v{version} to {client.endpoint} stalled: no reply within {timeout_s:.0f}s, "
                    f"{attempts} attempts (learner.push_timeout_s, learner.push_attempts); is the server hung?"
                ) from exc
            log.warning(
                "weight push of v%d to %s stalled (%s; attempt %d of %d); sending the update again",
                version,
                client.endpoint,
                exc,
                attempt,
                attempts,
            )
            attempt += 1


def push_weights(clients: list[Client], chunks: list[WeightChunk], timeout_s: float, attempts: int) -> PushTiming:
    """Send every chunk to every server; returns the timing until all report the version live."""
    t0, engine_s = time.perf_counter(), 0.0

    def send_all(client: Client) -> WeightUpdateAck:
        for chunk in chunks:
            ack = client.call(chunk, timeout_s=timeout_s)
            beat()
            if not isinstance(ack, WeightUpdateAck):
                raise RuntimeError(f"{client.endpoint} answered {ack.KIND} to a weight chunk")
        return ack

    for client in clients:
        ack = with_retries(client, chunks[-1].version, timeout_s, attempts, send_all)
        if not (ack.applied and ack.version == chunks[-1].version):
            raise RuntimeError(f"{client.endpoint} did not apply version {chunks[-1].version}: {ack}")
        log.info("%s now serves v%d (engine reload %.2fs)", client.endpoint, ack.version, ack.apply_seconds)
        engine_s += ack.apply_seconds
    return PushTiming(time.perf_counter() - t0, engine_s)


def snapshot(tensors: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """CPU copies of the tensors: what a push that outlives the step sends (build_chunks makes zero-copy
    views of CPU tensors, which the next optimizer step would change under it)."""
    return [(name, t.detach().to("cpu", copy=True)) for name, t in tensors]


class BackgroundPushes:
    """Weight pushes that never hold the learner (issue 26; learner.background_push): one thread per
    policy server, each with its own socket, sends the newest version submitted (a snapshot's chunks)
    to its server and, while it was busy or its server did not answer, the newest one again: a server
    behind gets the newest weights, not every version in between. A timed-out or not-ready server is
    tried again every NOT_READY_RETRY_S, never failing the learner; resend() gives a server the newest
    again (it restarted: catch-up). acked: the version each server last confirmed (-1: none yet)."""

    def __init__(self, endpoints: list[str], timeout_s: float):
        self.endpoints, self.timeout_s = endpoints, timeout_s
        self.acked = [-1] * len(endpoints)
        self._pending: list[tuple[int, list[WeightChunk]] | None] = [None] * len(endpoints)
        self._sending = [-1] * len(endpoints)  # the version each thread is sending now (-1: none)
        self._newest: tuple[int, list[WeightChunk]] | None = None
        self._cond = threading.Condition()
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._serve, args=(i,), name=f"push-{i}", daemon=True)
            for i in range(len(endpoints))
        ]
        for t in self._threads:
            t.start()

    def submit(self, version: int, chunks: list[WeightChunk]) -> None:
        with self._cond:
            self._newest = (version, chunks)
            self._pending = [self._newest] * len(self.endpoints)
            self._cond.notify_all()

    def resend(self, index: int) -> None:
        """The newest version to server `index` again (it restarted and serves an older one)."""
        with self._cond:
            if self._newest is not None and self._sending[index] != self._newest[0]:
                self._pending[index] = self._newest
                self._cond.notify_all()

    def backlog(self) -> int:
        """Servers that have not confirmed the newest version submitted (being sent, or waiting)."""
        with self._cond:
            return 0 if self._newest is None else sum(v < self._newest[0] for v in self.acked)

    def wait(self, version: int, timeout_s: float) -> bool:
        """True once every server confirmed `version` (or newer), within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while min(self.acked) < version:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
                beat()
            return True

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=5)

    def _serve(self, i: int) -> None:
        client = Client(zmq.Context.instance(), self.endpoints[i], self.timeout_s)
        try:
            while True:
                with self._cond:
                    while self._pending[i] is None and not self._stopped:
                        self._cond.wait()
                    if self._stopped:
                        return
                    version, chunks = self._pending[i]
                    self._pending[i], self._sending[i] = None, version
                t0 = time.perf_counter()
                try:
                    for chunk in chunks:
                        ack = client.call(chunk, timeout_s=self.timeout_s)
                except (RequestTimeout, RemoteError) as exc:
                    log.warning(
                        "background push of v%d to %s: %s; trying the newest again", version, client.endpoint, exc
                    )
                    with self._cond:
                        if self._pending[i] is None:
                            self._pending[i] = (version, chunks)
                    time.sleep(NOT_READY_RETRY_S)
                    continue
                if not (isinstance(ack, WeightUpdateAck) and ack.applied and ack.version == version):
                    log.warning("%s did not apply v%d: %s", client.endpoint, version, ack)
                    with self._cond:
                        self._sending[i] = -1
                    continue
                with self._cond:
                    self._sending[i] = -1
                    self.acked[i] = max(self.acked[i], version)
                    self._cond.notify_all()
                log.info(
                    "%s now serves v%d (background push, %.1fs)", client.endpoint, version, time.perf_counter() - t0
                )
        finally:
            client.close()


class WeightPusher:
    """weight_sync.method -> one call that brings every policy server to a new version. The
    configuration was validated at load (pipeline/config.py: e.g. no nccl with LoRA); each push
    to one server may take up to `push_timeout_s` (learner.push_timeout_s)."""

    def __init__(
        self,
        sync: WeightSyncConfig,
        clients: list[Client],
        push_timeout_s: float,
        tensor_parallel_size: int,
        push_attempts: int,  # learner.push_attempts: tries per server before a stalled push fails
        shm_name: str = "",
    ):
        self.sync, self.clients, self.push_timeout_s = sync, clients, push_timeout_s
        self.push_attempts = push_attempts
        self.nccl = (
            NcclWeightPusher(sync, clients, push_timeout_s, tensor_parallel_size) if sync.method == "nccl" else None
        )
        # shm: one file, rewritten at every push (its pages stay allocated); named after the run
        # (shm_name), a learner restarted after a crash reuses the file its predecessor left
        self.shm_path = Path(sync.shm_dir) / f"empo2-weights-{shm_name or os.getpid()}.safetensors"

    def close(self) -> None:
        """Remove the shared-memory weight file (servers have loaded what they need from it)."""
        self.shm_path.unlink(missing_ok=True)

    def push(
        self,
        tensors: list[tuple[str, torch.Tensor]],
        version: int,
        lora_scale: float = 0.0,
        clients: list[Client] | None = None,
    ) -> PushTiming:
        """zmq, shm or nccl: every server (or only `clients`, a catch-up: not nccl, whose group spans
        them all) runs `version` when this returns. lora_scale > 0: the tensors are a LoRA adapter
        (adapter-only push; zmq and shm)."""
        clients = self.clients if clients is None else clients
        if self.sync.method == "zmq":
            return push_weights(
                clients,
                build_chunks(tensors, version, self.sync.zmq_chunk_bytes, lora_scale),
                self.push_timeout_s,
                self.push_attempts,
            )
        if self.sync.method == "nccl":
            return self.nccl.push(tensors, version)
        t0 = time.perf_counter()
        checksum = write_weight_file(self.shm_path, tensors)
        timing = push_weight_file(
            clients, str(self.shm_path), checksum, version, self.push_timeout_s, self.push_attempts, lora_scale
        )
        return PushTiming(time.perf_counter() - t0, timing.engine_seconds)

    def push_checkpoint(self, checkpoint_dir: Path, version: int, clients: list[Client] | None = None) -> PushTiming:
        """checkpoint: the servers (every one, or `clients`) load the model file of a checkpoint the
        learner wrote."""
        path = model_dir(checkpoint_dir) / "model.safetensors"
        if not path.is_file():
            raise RuntimeError(
                f"{checkpoint_dir} has no single model.safetensors (sharded checkpoints are not supported by weight_sync=checkpoint)"
            )
        return push_weight_file(
            self.clients if clients is None else clients,
            str(path.resolve()),
            file_checksum(str(path)),
            version,
            self.push_timeout_s,
            self.push_attempts,
        )


def require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{what} needs a CUDA GPU, and none is visible (torch.cuda.is_available() is False). "
            "On CPU hosts use weight_sync.method=zmq (any host), shm (same host) or checkpoint (shared filesystem)."
        )


class ZmqWeightSyncClient:
    """vLLM's VLLMWeightSyncClient protocol over this project's socket to one policy server.

    vLLM's trainer engine calls start -> update (in a thread, while it broadcasts) -> finish. The
    server does all three inside one NcclTransferUpdate (its update must be atomic at its version
    gate), so start and finish are no-ops here; `version` is what the update makes live.
    """

    def __init__(self, client: Client, timeout_s: float):
        self.client, self.timeout_s, self.version = client, timeout_s, 0

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        fields = {f.name for f in dataclasses.fields(NcclTransferInit)}
        self._call(NcclTransferInit(**{k: v for k, v in init_info.items() if k in fields}))

    def start_weight_update(self) -> None:
        pass

    def update_weights(self, update_info: dict) -> None:
        ack = self._call(NcclTransferUpdate(version=self.version, **update_info))
        if not (ack.applied and ack.version == self.version):
            raise RuntimeError(f"{self.client.endpoint} did not apply version {self.version}: {ack}")

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        pass

    def _call(self, msg) -> WeightUpdateAck:
        ack = self.client.call(msg, timeout_s=self.timeout_s)
        if not isinstance(ack, WeightUpdateAck):
            raise RuntimeError(f"{self.client.endpoint} answered {ack.KIND} to {msg.KIND}")
        return ack


class NcclWeightPusher:
    """weight_sync.method=nccl: one vLLM NCCL transfer group per policy server (the learner is
    rank 0, the server's tensor-parallel workers follow), on ports nccl_port, nccl_port+1, ..."""

    def __init__(self, sync: WeightSyncConfig, clients: list[Client], push_timeout_s: float, tensor_parallel_size: int):
        require_cuda("weight_sync.method=nccl")
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine

        self.source = _TensorSource()
        self.groups = []
        for i, client in enumerate(clients):
            sync_client = ZmqWeightSyncClient(client, push_timeout_s)
            info = NCCLTrainerInitInfo(
                master_address=sync.nccl_address,
                master_port=sync.nccl_port + i,
                world_size=1 + tensor_parallel_size,
                rank=0,
            )
            self.groups.append(
                (
                    sync_client,
                    NCCLTrainerWeightTransferEngine.trainer_init(info, client=sync_client, source=self.source),
                )
            )
            log.info("NCCL weight transfer group %d ready with %s", i, client.endpoint)

    def push(self, tensors: list[tuple[str, torch.Tensor]], version: int) -> PushTiming:
        t0 = time.perf_counter()
        self.source.tensors = [(name, t.to("cuda", non_blocking=True)) for name, t in tensors]
        for sync_client, engine in self.groups:
            sync_client.version = version
            engine.send_weights()
        seconds = time.perf_counter() - t0
        return PushTiming(seconds, seconds)  # the receive is the load: NCCL writes into the engine's buffers


class _TensorSource:
    """vLLM's WeightSource contract (metadata + a fresh iteration per push) over a tensor list."""

    def __init__(self) -> None:
        self.tensors: list[tuple[str, torch.Tensor]] = []

    def metadata(self):
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.tensors]

    def __iter__(self):
        return iter(self.tensors)


def push_weight_file(
    clients: list[Client],
    path: str,
    checksum: str,
    version: int,
    timeout_s: float,
    attempts: int,
    lora_scale: float = 0.0,
) -> PushTiming:
    """Announce a written weight file to every server; returns the timing until all run it."""
    t0, engine_s = time.perf_counter(), 0.0
    update = WeightFile(version=version, path=path, checksum=checksum, lora_scale=lora_scale)
    for client in clients:
        ack = with_retries(client, version, timeout_s, attempts, lambda c: c.call(update, timeout_s=timeout_s))
        if not (isinstance(ack, WeightUpdateAck) and ack.applied and ack.version == version):
            raise RuntimeError(f"{client.endpoint} did not apply version {version}: {ack}")
        log.info("%s now serves v%d from %s (engine reload %.2fs)", client.endpoint, version, path, ack.apply_seconds)
        engine_s += ack.apply_seconds
    return PushTiming(time.perf_counter() - t0, engine_s)
