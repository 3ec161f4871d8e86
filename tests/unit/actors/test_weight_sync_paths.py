"""Weight-sync paths that need no engine: the NCCL control plane against vLLM's own payloads,
the clear refusals without a GPU, and the abort-and-retry policy of an update (on a stand-in
for vLLM's AsyncLLM: the version gate and the retry loop are what is tested here)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import zmq

from actors.policy_server.config import PolicyServerConfig
from actors.policy_server.engine import PolicyEngine, check_weight_sync
from common.config import ConfigError, WeightSyncConfig
from learner.weight_push import WeightPusher, ZmqWeightSyncClient
from pipeline.config import load_config
from protocol import Client, bind_router, recv_request, send_reply
from protocol.messages import GenerateRequest, NcclTransferInit, NcclTransferUpdate, WeightUpdateAck
from tests.helpers import free_endpoint

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on hosts without a GPU")


@no_gpu
def test_nccl_refused_clearly_without_gpu():
    # device=auto passes the load (a GPU may be there); the roles refuse at start-up
    with pytest.raises(RuntimeError, match="needs a CUDA GPU.*weight_sync.method=zmq"):
        WeightPusher(WeightSyncConfig(method="nccl"), [], 300.0, 1, 1)
    with pytest.raises(RuntimeError, match="NCCL weight transfer.*CUDA GPU"):
        check_weight_sync("nccl", "cpu")
    check_weight_sync("shm", "cpu")  # the CPU methods pass


def test_unknown_method_and_lora_with_nccl_refused_at_load():
    with pytest.raises(ConfigError, match=r"weight_sync\.method.*zmq, shm, checkpoint, nccl"):
        load_config(["weight_sync.method=rsync"])
    with pytest.raises(ConfigError, match=r"weight_sync\.method.*lora_rank"):
        load_config(["weight_sync.method=nccl", "learner.lora_rank=8"])


def test_nccl_control_plane_carries_vllm_payloads():
    """The messages take exactly the dicts vLLM's NCCL trainer engine hands its client."""
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    endpoint = free_endpoint()
    ctx = zmq.Context.instance()
    server = bind_router(ctx, endpoint)
    received = []

    def serve():
        for _ in range(2):
            request = recv_request(server)
            msg = request.message
            received.append(msg)
            version = getattr(msg, "version", 0)
            send_reply(
                server,
                request.identity,
                WeightUpdateAck(version=version, chunk_index=0, applied=isinstance(msg, NcclTransferUpdate)),
            )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ZmqWeightSyncClient(Client(ctx, endpoint, timeout_s=10), timeout_s=10)
    init = NCCLWeightTransferInitInfo(
        master_address="10.1.2.3", master_port=29600, rank_offset=1, world_size=3, packed=True
    )
    client.init_weight_transfer_engine(worker_init_payload(init))
    client.version = 7
    client.start_weight_update()
    client.update_weights(
        asdict(
            NCCLWeightTransferUpdateInfo(names=["a", "b"], dtype_names=["bfloat16", "float32"], shapes=[[2, 3], [4]])
        )
    )
    client.finish_weight_update()
    thread.join(10)
    server.close()
    client.client.close()

    init_msg, update_msg = received
    assert isinstance(init_msg, NcclTransferInit) and vars(init_msg) == worker_init_payload(init)
    assert isinstance(update_msg, NcclTransferUpdate)
    assert (update_msg.version, update_msg.names, update_msg.shapes) == (7, ["a", "b"], [[2, 3], [4]])


class _SlowEngine:
    """Stands in for AsyncLLM: streams one output per 10 ms tick until cancelled or done; records
    the requests started and the weight loads asked of its workers."""

    def __init__(self, ticks: int):
        self.ticks, self.started, self.rpcs = ticks, [], []

    async def generate(self, prompt, params, request_id):
        self.started.append(request_id)
        for _ in range(self.ticks):
            await asyncio.sleep(0.01)
            yield SimpleNamespace(
                outputs=[
                    SimpleNamespace(
                        token_ids=[1], logprobs=[{1: SimpleNamespace(logprob=-0.5)}], text="x", finish_reason="stop"
                    )
                ]
            )

    async def collective_rpc(self, method, args=()):
        self.rpcs.append((method, args))
        return [1]  # tensors loaded per worker

    async def reset_prefix_cache(self):
        pass


def _engine(on_update: str, ticks: int) -> PolicyEngine:
    # no vLLM: the stand-in engine; the version gate, the retry loop and the update are the real ones
    cfg = PolicyServerConfig(on_update=on_update)
    return PolicyEngine("base-model", cfg, seed=0, weight_sync="zmq", engine=_SlowEngine(ticks))


def _request(prompt: list[int]) -> GenerateRequest:
    return GenerateRequest(
        request_id="r1", prompt_token_ids=np.asarray(prompt, dtype=np.int32), max_tokens=4, temperature=1.0, seed=0
    )


async def _generate_during_update(engine: PolicyEngine):
    generation = asyncio.create_task(engine.generate(_request([1, 2])))
    await asyncio.sleep(0.05)  # the generation is in flight
    update_done = asyncio.create_task(engine.load_weights("/dev/shm/w.safetensors", 1))
    completion = await generation
    await update_done
    return completion


@pytest.mark.parametrize("on_update, version, retries", [("finish", 0, 0), ("abort", 1, 1)])
def test_in_flight_generation_finishes_or_is_retried(on_update, version, retries):
    engine = _engine(on_update, ticks=30)
    completion = asyncio.run(_generate_during_update(engine))
    assert engine.engine.rpcs == [("load_weights_from_file", ("/dev/shm/w.safetensors", "base-model", 0.0))]
    assert engine.version == 1
    # finish: the response is wholly old-version; abort: it was run again, wholly on the new weights
    assert (completion.policy_version, completion.retries) == (version, retries)
    assert engine.engine.started == (["r1"] if on_update == "finish" else ["r1", "r1-1"])


def test_cancelled_request_is_not_retried():
    engine = _engine("abort", ticks=100)

    async def run():
        generation = asyncio.create_task(engine.generate(_request([1])))
        await asyncio.sleep(0.05)
        generation.cancel()  # e.g. the server shutting down: propagates, no retry
        with pytest.raises(asyncio.CancelledError):
            await generation

    asyncio.run(run())
    assert engine.engine.started == ["r1"] and engine.generations_in_flight == 0
