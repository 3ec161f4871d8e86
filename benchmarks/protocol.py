"""The protocol's cost: messages/s through a real ZeroMQ DEALER -> ROUTER pair over loopback TCP,
encoded and decoded by protocol.codec (typed, validated), against raw ZeroMQ + msgpack carrying
the same payloads (the same fields in one msgpack map, the same arrays as raw frames, decoded with
msgpack.unpackb and np.frombuffer): the floor any wire format pays. Both run in the same process,
interleaved round by round, so the machine's load hits both alike; the result is their ratio.

Payloads: an 800-token GenerateRequest (the actors' hot path), a 30-turn Trajectory (~24k tokens:
the replay buffer's), a MemoryQuery (a ~500-character state) and a Ping.

Run: `.venv/bin/python -m benchmarks.protocol [--seconds 1.0] [--rounds 5] [--out benchmarks/results/protocol.json]`
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import msgpack
import numpy as np
import zmq

from benchmarks.record import run_header, write_result
from protocol.codec import decode, encode
from protocol.messages import GenerateRequest, MemoryQuery, Ping
from testing.factories import random_turns
from testing.factories import trajectory as synthetic_trajectory

WINDOW = 64  # messages in flight: sent, then received, per batch


def payloads() -> dict[str, object]:
    rng = np.random.default_rng(0)
    turns = 30
    prompt_lens = rng.integers(600, 900, turns)
    response_lens = rng.integers(4, 32, turns)
    trajectory = synthetic_trajectory(
        random_turns(rng, prompt_lens, response_lens),
        episode_id="e" * 32,
        group_id="g" * 32,
        slot=3,
        actor_id="env_actor-0",
        variation=7,
        score=25.0,
        done=False,
        observations=["This room is called the kitchen. In it, you see: a fridge, a counter." * 4] * turns,
        actions=["open fridge"] * turns,
    )
    return {
        "generate_request_800": GenerateRequest("req-1", rng.integers(0, 49152, 800, dtype=np.int32), 32, 1.0, 7),
        "trajectory_30_turns": trajectory,
        "memory_query": MemoryQuery(task="find-living-thing", variation=7, state="a kitchen with a fridge " * 20),
        "ping": Ping(sender="env_actor-0"),
    }


# ------------------------------------------------------------------ raw ZeroMQ + msgpack baseline


def raw_encode(msg) -> list:
    """The same payload, hand-rolled: scalar and list fields in one msgpack map, arrays as raw frames."""
    fields, buffers = {}, []
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if isinstance(value, np.ndarray):
            buffers.append(memoryview(np.ascontiguousarray(value).reshape(-1).view(np.uint8)))
            fields[f.name] = [len(buffers) - 1, value.dtype.str, value.shape]
        else:
            fields[f.name] = value
    return [msg.KIND.encode(), msgpack.packb(fields, use_bin_type=True), *buffers]


def raw_decode(frames) -> dict:
    fields = msgpack.unpackb(frames[1].buffer, raw=False)
    for name, value in fields.items():
        if isinstance(value, list) and len(value) == 3 and isinstance(value[1], str) and value[1][:1] in "<|>":
            index, dtype, shape = value
            fields[name] = np.frombuffer(frames[2 + index].buffer, dtype=dtype).reshape(shape)
    return fields


def protocol_decode(frames):
    return decode(frames)


# ------------------------------------------------------------------------------------- the loop


def rate(dealer, router, frames_of, decode_of, msg, seconds: float) -> float:
    """Messages/s: each message encoded, sent DEALER -> ROUTER, received and decoded, WINDOW at a time."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(WINDOW):
            dealer.send_multipart(frames_of(msg), copy=False)
        for _ in range(WINDOW):
            frames = router.recv_multipart(copy=False)
            decode_of(frames[1:])
        n += WINDOW
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="timed seconds per payload, side and round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    parser.add_argument("--out", default="benchmarks/results/protocol.json")
    args = parser.parse_args(argv)

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind("tcp://127.0.0.1:*")
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(router.last_endpoint.decode())
    results = {}
    for name, msg in payloads().items():
        frames = encode(msg)
        decode(frames)  # valid, and the schema cache warm
        nbytes = sum(len(memoryview(f).cast("B")) for f in frames)
        sides = {"protocol": (encode, protocol_decode), "raw_msgpack": (raw_encode, raw_decode)}
        rates = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, (enc, dec) in sides.items():
                rates[side].append(rate(dealer, router, enc, dec, msg, args.seconds))
        protocol, raw = statistics.median(rates["protocol"]), statistics.median(rates["raw_msgpack"])
        results[name] = {
            "bytes": nbytes,
            "protocol_msgs_per_s": round(protocol),
            "raw_msgpack_msgs_per_s": round(raw),
            "ratio": round(protocol / raw, 3),
            "rounds": {side: [round(r) for r in values] for side, values in rates.items()},
        }
        print(f"{name:24s} {nbytes:>9d} B  protocol {protocol:>9.0f}/s  raw {raw:>9.0f}/s  ratio {protocol / raw:.2f}")
    dealer.close(linger=0)
    router.close(linger=0)
    ctx.term()
    invocation = [".venv/bin/python", "-m", "benchmarks.protocol"]
    header = run_header(invocation, list(argv if argv is not None else sys.argv[1:]), load_average=os.getloadavg())
    write_result(args.out, {**header, "target_ratio": 0.5, "window": WINDOW, "payloads": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
