"""Hostile inputs for a server's socket, and a run of them against a live server: what
benchmarks/fuzz.py reports per socket and the tests send to the real servers.

An input is drawn, with a seeded random.Random, from four families:
  frames    random frames (1-6 frames of random bytes; sometimes a valid kind in frame 0)
  msgpack   a valid kind with a random msgpack body, or a header with a random version
  mutated   a valid message of a kind the socket serves, mutated: array dtypes, shapes, offsets,
            NaN/inf, negative and out-of-vocabulary ids, huge strings (up to 8 MiB), wrong or
            missing protocol version, missing or extra frames and fields, wrong field types
  foreign   a valid message of a kind the socket does not serve
and fuzz_endpoint checks, after every few hundred, that a Ping and a real request of the socket
(AssignmentRequest, MemoryQuery, a greedy GenerateRequest) are still answered correctly.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from collections import Counter
from collections.abc import Callable

import msgpack
import numpy as np
import zmq

from protocol.codec import PROTOCOL_VERSION, decode, encode, message_types
from protocol.messages import (
    AssignmentRequest,
    BatchRequest,
    EpisodeReport,
    ErrorReply,
    GenerateRequest,
    GenerateResponse,
    LeaseRenewal,
    MemoryQuery,
    MemoryResult,
    Ping,
    Pong,
    TensorMeta,
    WeightChunk,
    WeightFile,
)
from protocol.security import secure_client
from protocol.transport import Client, wait_until_ready
from testing.factories import Turn
from testing.factories import trajectory as synthetic_trajectory

REPLY_TIMEOUT_S = 15.0  # per input: a server that does not answer within this is reported as such
HUGE = 8 << 20  # the largest string a mutation sends


def valid_messages(rng: random.Random) -> dict[str, list]:
    """Valid messages of each socket: the seeds of the mutations."""
    turns = rng.randint(1, 4)
    prompt_lens = [rng.randint(1, 20) for _ in range(turns)]
    response_lens = [rng.randint(1, 8) for _ in range(turns)]
    # turn i's tokens: the next prompt_lens[i] (response_lens[i]) of one running count
    prompts = np.split(np.arange(sum(prompt_lens), dtype=np.int32), np.cumsum(prompt_lens)[:-1])
    responses = np.split(np.arange(sum(response_lens), dtype=np.int32), np.cumsum(response_lens)[:-1])
    trajectory = synthetic_trajectory(
        [Turn(p, r, -np.ones(len(r), np.float32)) for p, r in zip(prompts, responses)],
        episode_id=f"fuzz-{rng.getrandbits(64):x}",
        group_id=f"{rng.getrandbits(128):032x}",
        observations=["a kitchen"] * turns,
        score=10.0,
        actor_id="fuzz",
        done=False,
    )
    report = EpisodeReport(
        episode_id=f"fuzz-{rng.getrandbits(64):x}",
        task="find-living-thing",
        variation=0,
        task_description="find a living thing",
        score=10.0,
        observations=["a kitchen"] * turns,
        actions=["look around"] * turns,
    )
    weights = np.zeros(rng.choice([4, 64]), np.float32)
    return {
        "replay_buffer": [
            trajectory,
            AssignmentRequest(actor_id="fuzz", incarnation=f"{rng.getrandbits(64):x}"),
            LeaseRenewal(actor_id="fuzz", incarnation=f"{rng.getrandbits(64):x}", group_id="fuzz-group", slot=0),
            BatchRequest(learner_version=0, num_groups=1, max_staleness=4),
            Ping(sender="fuzz"),
        ],
        "memory_service": [report, MemoryQuery(task="find-living-thing", variation=0, state="a kitchen"), Ping("f")],
        "policy_server": [
            generate_request(rng),
            WeightChunk(
                version=rng.randint(1, 3),
                chunk_index=0,
                num_chunks=1,
                checksum="0" * 32,
                tensors=[TensorMeta("model.norm.weight", "float32", [weights.size])],
                data=[weights.view(np.uint8)],
            ),
            WeightFile(version=1, path="/dev/shm/empo2-fuzz.safetensors", checksum="0" * 32),
            Ping(sender="fuzz"),
        ],
    }


def generate_request(rng: random.Random) -> GenerateRequest:
    """A short greedy generation: a few token ids, a few tokens out."""
    return GenerateRequest(
        request_id=f"fuzz-{rng.getrandbits(64):x}",
        prompt_token_ids=np.asarray([rng.randrange(1, 1000) for _ in range(rng.randint(1, 16))], np.int32),
        max_tokens=4,
        temperature=0.0,
        seed=0,
    )


# ------------------------------------------------------------------------------------ mutations


def _bad_array(rng: random.Random, arr: np.ndarray) -> np.ndarray:
    choice = rng.randrange(7)
    if choice == 0:
        return arr.astype(rng.choice([np.float32, np.int64, np.uint8, np.float16]))
    if choice == 1:
        return np.stack([arr, arr]) if arr.ndim == 1 else arr.reshape(-1)
    if choice == 2:
        return arr[: max(0, arr.size - 1)] if arr.ndim == 1 else arr
    if choice == 3 and arr.dtype.kind == "f" and arr.size:
        out = arr.copy()
        out.flat[rng.randrange(out.size)] = rng.choice([np.nan, np.inf, -np.inf])
        return out
    if choice == 4 and arr.dtype.kind == "i":
        return (arr.astype(np.int64) - rng.choice([1, 2**20, 2**31 - 1])).astype(arr.dtype)
    if choice == 5:
        return (arr.astype(np.float64) + rng.choice([1, 50_000, 2**30])).astype(arr.dtype)
    return np.zeros(rng.choice([0, 3, 1000]), arr.dtype)


def mutate_message(rng: random.Random, msg) -> list[bytes]:
    """A valid message with one field made wrong, encoded (some mutations are of the frames)."""
    msg = copy.deepcopy(msg)
    fields = [f.name for f in dataclasses.fields(msg)]
    name = rng.choice(fields)
    value = getattr(msg, name)
    if isinstance(value, np.ndarray):
        value = _bad_array(rng, value)
    elif isinstance(value, str):
        value = rng.choice(["", "x" * rng.choice([300, 70_000, 1 << 20, HUGE]), "\udcff", "task-0042"])
    elif isinstance(value, bool):
        value = not value
    elif isinstance(value, int):
        value = rng.choice([-1, -(2**31), 2**31 - 1, 2**63 - 1, 10**6])
    elif isinstance(value, float):
        value = rng.choice([float("nan"), float("inf"), -1e308, 1e9])
    elif isinstance(value, list):
        value = rng.choice([[], value * 500, ["y" * (1 << 20)] * len(value), [1.5] * len(value)])
    object.__setattr__(msg, name, value)
    try:
        frames = [bytes(memoryview(f).cast("B")) for f in encode(msg)]
    except Exception:  # the mutation is not even encodable (a lone surrogate): send the raw text
        return [msg.KIND.encode(), str(value)[:1000].encode("utf-8", "replace")]
    wire = rng.randrange(6)
    if wire == 0:  # wrong, missing or mistyped protocol version
        header = msgpack.unpackb(frames[1], raw=False)
        header["v"] = rng.choice([PROTOCOL_VERSION + 1, 0, "1", None, -(2**63)])
        if rng.random() < 0.3:
            header.pop("v")
        frames[1] = msgpack.packb(header, use_bin_type=True)
    elif wire == 1 and len(frames) > 2:  # a missing buffer frame
        frames.pop(rng.randrange(2, len(frames)))
    elif wire == 2:  # an extra frame
        frames.append(rng.randbytes(rng.randrange(64)))
    elif wire == 3:  # a missing or an extra field
        header = msgpack.unpackb(frames[1], raw=False)
        body = header["body"]
        if rng.random() < 0.5 and body:
            body.pop(rng.choice(list(body)))
        else:
            body["extra"] = 1
        frames[1] = msgpack.packb(header, use_bin_type=True)
    return frames


def random_msgpack(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.randint(-(2**63), 2**64 - 1)
    if kind == 1:
        return rng.random() * 10 ** rng.randint(-5, 300)
    if kind == 2:
        return rng.randbytes(rng.randrange(32)).decode("latin-1")
    if kind == 3:
        return rng.randbytes(rng.randrange(32))
    if kind == 4:
        return rng.choice([None, True, False])
    if kind == 5:
        return [random_msgpack(rng, depth + 1) for _ in range(rng.randrange(5))]
    if kind == 6:
        return {"__nd__": rng.randrange(-2, 3), "dtype": rng.choice(["int32", "object", "float64"]), "shape": [3]}
    return {str(random_msgpack(rng, 3)): random_msgpack(rng, depth + 1) for _ in range(rng.randrange(5))}


def hostile_input(rng: random.Random, socket: str, seeds: dict[str, list]) -> tuple[str, list[bytes]]:
    family = rng.choices(["frames", "msgpack", "mutated", "foreign"], weights=[2, 2, 5, 1])[0]
    kinds = sorted(message_types())
    if family == "frames":
        frames = [rng.randbytes(rng.randrange(2000)) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.5:
            frames[0] = rng.choice(kinds).encode()
        return family, frames
    if family == "msgpack":
        header = {"v": PROTOCOL_VERSION, "body": random_msgpack(rng)}
        if rng.random() < 0.3:
            header = random_msgpack(rng)
        frames = [rng.choice(kinds).encode(), msgpack.packb(header, use_bin_type=True)]
        return family, frames + [rng.randbytes(rng.randrange(64)) for _ in range(rng.randrange(3))]
    if family == "mutated":
        return family, mutate_message(rng, rng.choice(seeds[socket]))
    other = [m for s, msgs in seeds.items() if s != socket for m in msgs if not isinstance(m, Ping)]
    return family, [bytes(memoryview(f).cast("B")) for f in encode(rng.choice(other))]


# ------------------------------------------------------------------------------------ a live server


def valid_request_works(client: Client, socket: str) -> bool:
    """A Ping and a real request of the socket answered as they should be."""
    try:
        if not isinstance(client.call(Ping(sender="fuzz-check")), Pong):
            return False
        if socket == "replay_buffer":
            reply = client.call(AssignmentRequest(actor_id="fuzz-check"))
            return reply.KIND in ("assignment", "wait")
        if socket == "policy_server":
            reply = client.call(generate_request(random.Random(0)))
            return isinstance(reply, GenerateResponse) and reply.token_ids.size > 0
        result = client.call(MemoryQuery(task="find-living-thing", variation=0, state="a kitchen with a fridge"))
        return isinstance(result, MemoryResult)
    except Exception:
        client.reset()
        return False


def fuzz_endpoint(
    endpoint: str,
    socket: str,
    inputs: int,
    check_every: int,
    seed: int,
    alive: Callable[[], bool],
    memory_mb: Callable[[], float],
    reply_timeout_s: float | None = None,
) -> dict:
    """`inputs` hostile inputs to the running `socket` server at `endpoint` (up while `alive()`; its
    memory in MB read by `memory_mb()` at each check), a valid request after every `check_every`;
    the figures. An input not answered within `reply_timeout_s` (REPLY_TIMEOUT_S) counts as
    no_reply. The sockets follow the process's CURVE setting (protocol/security.py), so a live
    run under CURVE is fuzzed past its handshake."""
    reply_timeout_s = REPLY_TIMEOUT_S if reply_timeout_s is None else reply_timeout_s
    ctx = zmq.Context()
    checker = Client(ctx, endpoint, timeout_s=reply_timeout_s)
    rng = random.Random(seed)
    families, replies, checks = Counter(), Counter(), Counter()
    latencies = []
    sock = None  # the hostile inputs' socket, replaced after an input that got no answer
    unresponsive = False
    try:
        version_before = wait_until_ready(checker, "fuzz", timeout_s=600).policy_version
        rss = [memory_mb()]
        t0 = time.monotonic()
        for i in range(inputs):
            seeds = valid_messages(rng)
            family, frames = hostile_input(rng, socket, seeds)
            families[family] += 1
            if sock is None:
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                secure_client(sock)
                sock.connect(endpoint)
            start = time.monotonic()
            sock.send_multipart(frames)
            if sock.poll(int(reply_timeout_s * 1000)):
                latencies.append(time.monotonic() - start)
                try:
                    reply = decode(sock.recv_multipart())
                    replies[f"{reply.KIND}:{reply.reason}" if isinstance(reply, ErrorReply) else reply.KIND] += 1
                except Exception:
                    replies["undecodable_reply"] += 1
            else:  # dropped by libzmq (a frame over the size limit) or not answered: a new socket
                replies["no_reply"] += 1
                sock.close(linger=0)
                sock = None
                if not valid_request_works(checker, socket):
                    # not a dropped frame: the server stopped answering, and each input left would
                    # wait out its timeout (200 inputs: 50 minutes) to learn nothing more
                    checks["failed"] += 1
                    unresponsive = True
                    break
            if not alive():
                break
            if (i + 1) % check_every == 0:
                checks["ok" if valid_request_works(checker, socket) else "failed"] += 1
                rss.append(memory_mb())
        seconds = time.monotonic() - t0
        crashed = not alive()
        version_after = None
        if not crashed and not unresponsive:
            checks["ok" if valid_request_works(checker, socket) else "failed"] += 1
            rss.append(memory_mb())
            version_after = wait_until_ready(checker, "fuzz-check", timeout_s=60).policy_version
    finally:
        # every socket closed however the loop ended: Context.term() waits for each socket still open,
        # so one left by an exception (a check's timeout) hung the caller instead of raising
        if sock is not None:
            sock.close(linger=0)
        checker.close()
        ctx.term()
    return {
        "inputs_sent": sum(families.values()),
        "families": dict(families),
        "replies": dict(sorted(replies.items())),
        "crashed": crashed,
        "unresponsive": unresponsive,  # alive, but neither an input nor a valid request answered: stopped there
        "valid_checks": dict(checks),
        # the policy server's weights version: the same after the fuzzing (no weight message took),
        # unless a learner pushed meanwhile (a live run)
        "policy_version": {"before": version_before, "after": version_after},
        "seconds": round(seconds, 1),
        "reply_latency_p50_ms": round(1000 * float(np.percentile(latencies, 50)), 2) if latencies else None,
        "reply_latency_max_ms": round(1000 * max(latencies), 1) if latencies else None,
        "rss_mb": {"start": round(rss[0], 1), "max": round(max(rss), 1), "end": round(rss[-1], 1)},
    }
