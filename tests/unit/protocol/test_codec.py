"""protocol.codec: round trips of every registered message and strict rejection of bad frames."""

from __future__ import annotations

import dataclasses
import random

import msgpack
import numpy as np
import pytest

from protocol.codec import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_FRAMES,
    PROTOCOL_VERSION,
    Message,
    ProtocolError,
    decode,
    encode,
    message_types,
    pack_frames,
    unpack_frames,
)
from protocol.messages import (
    MAX_GENERATED_TEXT_CHARS,
    OFF_POLICY,
    ON_POLICY,
    ON_POLICY_TIPS,
    Ack,
    Assignment,
    AssignmentRequest,
    AssignmentReturn,
    Batch,
    BatchConfirm,
    BatchRequest,
    EpisodeReport,
    ErrorReply,
    GenerateRequest,
    GenerateResponse,
    LeaseRenewal,
    MemoryQuery,
    MemoryResult,
    NcclTransferInit,
    NcclTransferUpdate,
    Ping,
    Pong,
    StrategyQuery,
    StrategyResult,
    TensorMeta,
    Trajectory,
    Wait,
    WeightChunk,
    WeightFile,
    WeightUpdateAck,
)
from protocol.weight_file import weights_checksum
from testing.factories import Turn, make_trajectory, trajectory

# ------------------------------------------------------------------------------- helpers


def _weight_chunk() -> WeightChunk:
    a = np.arange(24, dtype=np.uint8)
    b = np.frombuffer(np.array([1.5, -2.0], np.float16).tobytes(), np.uint8).copy()
    return WeightChunk(
        version=3,
        chunk_index=1,
        num_chunks=2,
        tensors=[
            TensorMeta(name="model.layers.0.mlp.up_proj.weight", dtype="bfloat16", shape=[3, 4]),
            TensorMeta(name="model.norm.weight", dtype="float16", shape=[2]),
        ],
        data=[a, b],
        checksum=weights_checksum([a, b]),
    )


# One valid sample per registered kind. A new message type without a sample fails
# test_samples_cover_every_registered_message_type.
SAMPLES: dict[str, callable] = {
    "ping": lambda: Ping(sender="env_actor-0"),
    "pong": lambda: Pong(role="replay_buffer", policy_version=-1, ready=False),
    "error": lambda: ErrorReply(reason="schema", detail="ping.sender: expected str"),
    "ack": lambda: Ack(ref="ep-9", detail="stored"),
    "wait": lambda: Wait(retry_after_s=0.25, reason="2 groups ready"),
    "generate_request": lambda: GenerateRequest(
        request_id="req-1",
        prompt_token_ids=np.array([1, 2, 3, 2**31 - 1], np.int32),
        max_tokens=32,
        temperature=0.7,
        seed=12345,
        top_p=0.9,
        stop=["\n", "</s>"],
    ),
    "generate_response": lambda: GenerateResponse(
        request_id="req-1",
        token_ids=np.array([7, 8, 9], np.int32),
        logprobs=np.array([-0.5, -1.25, -3.0], np.float32),
        text="open door",
        policy_version=2,
        finish_reason="stop",
    ),
    "weight_chunk": _weight_chunk,
    "weight_update_ack": lambda: WeightUpdateAck(version=3, chunk_index=1, applied=True, apply_seconds=1.5),
    "weight_file": lambda: WeightFile(version=4, path="/dev/shm/empo2-weights-1-v4.safetensors", checksum="ab" * 16),
    "nccl_transfer_init": lambda: NcclTransferInit(
        master_address="10.0.0.1",
        master_port=29600,
        rank_offset=1,
        world_size=3,
        packed=True,
        packed_buffer_size_bytes=1 << 30,
        packed_num_buffers=2,
    ),
    "nccl_transfer_update": lambda: NcclTransferUpdate(
        version=5,
        names=["model.embed_tokens.weight", "model.norm.weight"],
        dtype_names=["bfloat16", "float32"],
        shapes=[[49152, 576], [576]],
    ),
    "assignment_request": lambda: AssignmentRequest(actor_id="actor-1"),
    "assignment_return": lambda: AssignmentReturn(group_id="g1", slot=1, actor_id="actor-1", incarnation="i1"),
    "lease_renewal": lambda: LeaseRenewal(actor_id="actor-1", incarnation="9f" * 16, group_id="g1", slot=2),
    "assignment": lambda: Assignment(group_id="g1", slot=3, task="boil", variation=11, mode=OFF_POLICY, seed=2**31 - 1),
    "trajectory": lambda: make_trajectory(mode=ON_POLICY_TIPS, tip_spans=np.array([[0, 1, 4], [1, 0, 3]], np.int32)),
    "batch_request": lambda: BatchRequest(learner_version=5, num_groups=2, max_staleness=4),
    "batch_confirm": lambda: BatchConfirm(batch_id="b1"),
    "batch": lambda: Batch(
        trajectories=[
            make_trajectory(episode_id="a", slot=0),
            make_trajectory(episode_id="b", slot=1, prompt_lens=(2,), response_lens=(1,), versions=(9,)),
        ],
        dropped_stale=1,
    ),
    "memory_query": lambda: MemoryQuery(task="boil", variation=2, state="You are in the kitchen."),
    "memory_result": lambda: MemoryResult(tips=["tip a", "tip b"], scores=[100.0, 12.5], count=2),
    "strategy_query": lambda: StrategyQuery(group_id="g-1", task="boil", variation=2),
    "strategy_result": lambda: StrategyResult(strategies=["find the stove first"], scores=[25.0]),
    "episode_report": lambda: EpisodeReport(
        episode_id="ep-2",
        task="boil",
        variation=2,
        task_description="Boil water.",
        score=-100.0,
        observations=["o1", "o2"],
        actions=["a1", "a2"],
    ),
}


def assert_same(a, b, path: str = "msg") -> None:
    """Deep equality: dataclasses field by field, arrays by dtype, shape and values."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), path
        assert b.dtype == a.dtype, f"{path}: dtype {b.dtype} != {a.dtype}"
        assert b.shape == a.shape, f"{path}: shape {b.shape} != {a.shape}"
        assert np.array_equal(a, b), f"{path}: values differ"
    elif dataclasses.is_dataclass(a):
        assert type(b) is type(a), f"{path}: {type(b).__name__} != {type(a).__name__}"
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(b) == len(a), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert type(b) is type(a), f"{path}: {type(b).__name__} != {type(a).__name__}"
        assert b == a, f"{path}: {b!r} != {a!r}"


def header_of(frames) -> dict:
    return msgpack.unpackb(bytes(frames[1]), raw=False)


def with_header(frames, header: dict) -> list[bytes]:
    return [bytes(frames[0]), msgpack.packb(header, use_bin_type=True), *[bytes(f) for f in frames[2:]]]


def with_body(msg: Message, mutate) -> list[bytes]:
    """Encode msg, let `mutate(body)` edit the header body in place, re-pack."""
    frames = encode(msg)
    header = header_of(frames)
    mutate(header["body"])
    return with_header(frames, header)


def reject(frames, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(frames, max_bytes)
    return info.value


# ---------------------------------------------------------------------------- round trips


def test_samples_cover_every_registered_message_type():
    assert set(SAMPLES) == set(message_types())
    for kind, make in SAMPLES.items():
        assert make().KIND == kind


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_round_trip_preserves_every_field(kind):
    msg = SAMPLES[kind]()
    msg.validate()  # the samples themselves are valid
    frames = encode(msg)
    assert bytes(frames[0]) == kind.encode("ascii")
    assert header_of(frames)["v"] == PROTOCOL_VERSION
    assert_same(msg, decode(frames))


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_round_trip_from_copied_bytes_frames(kind):
    msg = SAMPLES[kind]()
    copies = [bytes(f) for f in encode(msg)]
    assert_same(msg, decode(copies))


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_round_trip_through_pack_frames_record(kind):
    msg = SAMPLES[kind]()
    assert_same(msg, decode(unpack_frames(pack_frames(encode(msg)))))


def test_array_fields_become_separate_frames_not_msgpack_bytes():
    msg = SAMPLES["generate_response"]()
    frames = encode(msg)
    assert len(frames) == 4  # kind, header, token_ids, logprobs
    assert bytes(frames[2]) == msg.token_ids.tobytes()
    assert bytes(frames[3]) == msg.logprobs.tobytes()
    body = header_of(frames)["body"]
    assert body["token_ids"] == {"__nd__": 0, "dtype": "int32", "shape": [3]}
    assert body["logprobs"] == {"__nd__": 1, "dtype": "float32", "shape": [3]}


def test_empty_tip_spans_round_trip_with_shape_0_by_3():
    traj = make_trajectory()
    assert traj.tip_spans.shape == (0, 3)
    out = decode([bytes(f) for f in encode(traj)])
    assert out.tip_spans.shape == (0, 3)
    assert out.tip_spans.dtype == np.int32
    assert out.turn_tip_spans(0) == []


def test_nested_batch_keeps_trajectory_arrays_apart():
    batch = SAMPLES["batch"]()
    out = decode(encode(batch))
    assert [t.episode_id for t in out.trajectories] == ["a", "b"]
    assert out.trajectories[1].num_turns == 1
    assert out.trajectories[1].policy_versions.tolist() == [9]
    np.testing.assert_array_equal(out.trajectories[0].turn_prompt(1), [105, 106, 107])
    np.testing.assert_array_equal(out.trajectories[0].turn_response(1), [502, 503, 504, 505])


def test_weight_chunk_tensor_meta_and_bytes_round_trip():
    chunk = _weight_chunk()
    out = decode(encode(chunk))
    assert all(isinstance(t, TensorMeta) for t in out.tensors)
    assert out.tensors[0].shape == [3, 4]
    assert weights_checksum(out.data) == chunk.checksum
    restored = np.frombuffer(out.data[1].tobytes(), np.float16)
    assert restored.tolist() == [1.5, -2.0]


def test_non_contiguous_and_fortran_arrays_round_trip():
    base = np.arange(20, dtype=np.int32)
    msg = GenerateRequest(request_id="r", prompt_token_ids=base[::3], max_tokens=1, temperature=0.0, seed=0)
    out = decode(encode(msg))
    assert out.prompt_token_ids.tolist() == [0, 3, 6, 9, 12, 15, 18]
    spans = np.array([[0, 1], [0, 2], [1, 3]], np.int32).T  # Fortran-ordered view: rows (turn, start, end)
    out = decode(encode(make_trajectory(tip_spans=spans)))
    assert out.tip_spans.tolist() == [[0, 0, 1], [1, 2, 3]]


def test_an_allowed_dtype_where_the_field_wants_another_is_refused_by_validate():
    resp = GenerateResponse(
        request_id="r",
        token_ids=np.zeros(2, np.int32),
        logprobs=np.zeros(2, np.float16),
        text="",
        policy_version=0,
        finish_reason="length",
    )  # float16 travels (weights), but a log-prob array is float32
    with pytest.raises(ProtocolError, match="logprobs must be float32"):
        decode(encode(resp))


def test_missing_field_with_default_takes_the_default():
    frames = with_body(Ack(ref="x", detail="will be removed"), lambda body: body.pop("detail"))
    out = decode(frames)
    assert out == Ack(ref="x", detail="")


def test_int_is_accepted_for_a_float_field_and_becomes_float():
    frames = with_body(Wait(retry_after_s=1.0), lambda body: body.__setitem__("retry_after_s", 2))
    out = decode(frames)
    assert out.retry_after_s == 2.0 and type(out.retry_after_s) is float


# ------------------------------------------------------------------------------ rejections


def test_unknown_kind_is_rejected():
    frames = encode(Ping(sender="x"))
    err = reject([b"no_such_kind", *frames[1:]])
    assert err.reason == "unknown_kind"


def test_kind_with_non_ascii_bytes_is_rejected_as_unknown():
    frames = encode(Ping(sender="x"))
    assert reject([b"\xff\xfeping", *frames[1:]]).reason == "unknown_kind"


def test_other_protocol_version_is_rejected():
    frames = encode(Ping(sender="x"))
    header = header_of(frames)
    header["v"] = PROTOCOL_VERSION + 1
    err = reject(with_header(frames, header))
    assert err.reason == "bad_version"
    assert str(PROTOCOL_VERSION + 1) in str(err)


@pytest.mark.parametrize("version", [True, 1.0])
def test_version_must_be_the_integer_not_a_bool_or_float(version):
    frames = encode(Ping(sender="x"))
    header = header_of(frames)
    header["v"] = version
    assert reject(with_header(frames, header)).reason == "bad_version"


@pytest.mark.parametrize(
    "header",
    [[1, {"sender": "x"}], "just a string", 42, {"v": 1}, {"body": {"sender": "x"}}, {"v": 1, "body": {}, "x": 0}],
    ids=["list", "str", "int", "no_body", "no_version", "extra_key"],
)
def test_header_must_be_a_map_with_exactly_v_and_body(header):
    err = reject([b"ping", msgpack.packb(header, use_bin_type=True)])
    assert err.reason == "malformed"


def test_header_with_non_string_map_keys_is_rejected():
    err = reject([b"ping", msgpack.packb({1: 1, "body": {}}, use_bin_type=True)])
    assert err.reason == "malformed"


@pytest.mark.parametrize("frames", [[], [b"ping"]], ids=["no_frames", "kind_only"])
def test_fewer_than_two_frames_is_rejected(frames):
    assert reject(frames).reason == "malformed"


def test_unknown_field_is_rejected():
    frames = with_body(Ping(sender="x"), lambda body: body.__setitem__("admin", True))
    err = reject(frames)
    assert err.reason == "schema"
    assert "admin" in str(err)


def test_missing_required_field_is_rejected():
    frames = with_body(Pong(role="r", policy_version=1, ready=True), lambda body: body.pop("ready"))
    err = reject(frames)
    assert err.reason == "schema"
    assert "ready" in str(err)


def test_unknown_field_in_nested_dataclass_is_rejected():
    def mutate(body):
        body["tensors"][0]["extra"] = 1

    assert reject(with_body(_weight_chunk(), mutate)).reason == "schema"


@pytest.mark.parametrize(
    "msg, field, bad_value",
    [
        (Pong(role="r", policy_version=1, ready=True), "policy_version", "1"),  # str for int
        (Pong(role="r", policy_version=1, ready=True), "policy_version", True),  # bool for int
        (Pong(role="r", policy_version=1, ready=True), "policy_version", 1.0),  # float for int
        (Pong(role="r", policy_version=1, ready=True), "role", 1.5),  # float for str
        (Pong(role="r", policy_version=1, ready=True), "role", b"r"),  # bytes for str
        (Pong(role="r", policy_version=1, ready=True), "ready", 1),  # int for bool
        (Wait(retry_after_s=1.0), "retry_after_s", True),  # bool for float
        (Wait(retry_after_s=1.0), "retry_after_s", "1.0"),  # str for float
        (MemoryResult(tips=["a"], scores=[1.0], count=1), "tips", "a"),  # str for list
        (MemoryResult(tips=["a"], scores=[1.0], count=1), "tips", [1]),  # int in list[str]
        (MemoryResult(tips=["a"], scores=[1.0], count=1), "scores", [None]),  # nil in list[float]
        (Batch(trajectories=[], dropped_stale=0), "trajectories", [5]),  # int for dataclass
        (GenerateResponse("r", np.zeros(1, np.int32), np.zeros(1, np.float32), "", 0, "stop"), "token_ids", [1]),
    ],
    ids=[
        "str_for_int",
        "bool_for_int",
        "float_for_int",
        "float_for_str",
        "bytes_for_str",
        "int_for_bool",
        "bool_for_float",
        "str_for_float",
        "str_for_list",
        "int_in_str_list",
        "nil_in_float_list",
        "int_for_dataclass",
        "list_for_array",
    ],
)
def test_wrong_field_type_is_rejected(msg, field, bad_value):
    err = reject(with_body(msg, lambda body: body.__setitem__(field, bad_value)))
    assert err.reason == "schema"
    assert field in str(err)


def _gen_response(n: int = 3) -> GenerateResponse:
    return GenerateResponse("r", np.arange(n, dtype=np.int32), np.zeros(n, np.float32), "t", 0, "stop")


@pytest.mark.parametrize("dtype", ["float64", "object", "bool", ">i4", "int8"])
def test_array_with_disallowed_dtype_is_rejected(dtype):
    def mutate(body):
        body["logprobs"]["dtype"] = dtype

    err = reject(with_body(_gen_response(2), mutate))  # 2 float32 = 8 bytes = 1 float64
    assert err.reason == "schema"
    assert "not allowed" in str(err)


def test_encoding_a_float64_array_produces_frames_that_decode_rejects():
    msg = GenerateResponse("r", np.zeros(2, np.int32), np.zeros(2, np.float64), "t", 0, "stop")
    assert reject(encode(msg)).reason == "schema"


@pytest.mark.parametrize("shape", [[4], [2, 2], [0], [3, 1, 2]])
def test_array_whose_buffer_size_does_not_match_shape_is_rejected(shape):
    def mutate(body):
        body["token_ids"]["shape"] = shape

    err = reject(with_body(_gen_response(3), mutate))
    assert err.reason == "malformed"
    assert "bytes" in str(err)


def test_truncated_array_frame_is_rejected():
    frames = [bytes(f) for f in encode(_gen_response(3))]
    frames[2] = frames[2][:-1]
    assert reject(frames).reason == "malformed"


@pytest.mark.parametrize("shape", [[-1], "3", [1.5], None], ids=["negative", "str", "float", "nil"])
def test_array_with_bad_shape_is_rejected(shape):
    def mutate(body):
        body["token_ids"]["shape"] = shape

    assert reject(with_body(_gen_response(3), mutate)).reason == "schema"


def test_array_reference_with_extra_keys_is_rejected():
    def mutate(body):
        body["token_ids"]["offset"] = 0

    assert reject(with_body(_gen_response(3), mutate)).reason == "schema"


@pytest.mark.parametrize("index", [2, -1, 99, "0", None], ids=["past_end", "negative", "far", "str", "nil"])
def test_array_buffer_index_out_of_range_is_rejected(index):
    def mutate(body):
        body["logprobs"]["__nd__"] = index

    err = reject(with_body(_gen_response(3), mutate))
    assert err.reason == "malformed"
    assert "buffer index" in str(err)


def test_array_buffer_index_reused_is_rejected():
    def mutate(body):  # int32[3] and float32[3] have the same size: only the reuse is wrong
        body["logprobs"]["__nd__"] = 0

    err = reject(with_body(_gen_response(3), mutate))
    assert err.reason == "malformed"
    assert "reused" in str(err)


def test_array_buffer_index_given_as_bool_is_rejected():
    def mutate(body):
        body["logprobs"]["__nd__"] = True

    assert reject(with_body(_gen_response(3), mutate)).reason == "malformed"


def test_unreferenced_extra_frame_is_rejected():
    frames = [bytes(f) for f in encode(_gen_response(3))] + [b"\x00" * 4]
    err = reject(frames)
    assert err.reason == "malformed"
    assert "unreferenced" in str(err)


def test_buffer_frame_on_a_message_without_arrays_is_rejected():
    frames = [bytes(f) for f in encode(Ping(sender="x"))] + [b""]
    assert reject(frames).reason == "malformed"


def test_too_many_frames_is_rejected():
    frames = [bytes(f) for f in encode(Ping(sender="x"))]
    frames += [b""] * (MAX_FRAMES + 1 - len(frames))
    assert len(frames) == MAX_FRAMES + 1
    assert reject(frames).reason == "too_large"


def test_message_over_max_bytes_is_rejected():
    frames = [bytes(f) for f in encode(_gen_response(64))]
    total = sum(len(f) for f in frames)
    assert decode(frames, max_bytes=total).request_id == "r"  # exactly at the limit is fine
    err = reject(frames, max_bytes=total - 1)
    assert err.reason == "too_large"
    assert str(total) in str(err)


@pytest.mark.parametrize(
    "header",
    [b"\xc1", b"", b"\x82\xa1v", b"\x81\xa1v\x01\xff", b"\xdb\xff\xff\xff\xff"],
    ids=["never_used_byte", "empty", "truncated_map", "extra_data", "huge_str_length"],
)
def test_msgpack_garbage_in_header_is_rejected(header):
    assert reject([b"ping", header]).reason == "malformed"


def test_msgpack_ext_type_in_header_is_rejected():
    header = msgpack.packb({"v": 1, "body": {"sender": msgpack.ExtType(5, b"payload")}}, use_bin_type=True)
    err = reject([b"ping", header])
    assert err.reason == "malformed"
    assert "extension type 5" in str(err)


def test_msgpack_timestamp_ext_in_header_is_rejected():
    import datetime

    # msgpack decodes ext type -1 (timestamp) itself, without calling ext_hook; the field type
    # check must still refuse the resulting Timestamp object.
    stamp = msgpack.Timestamp.from_datetime(datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc))
    header = msgpack.packb({"v": 1, "body": {"sender": stamp}}, use_bin_type=True)
    assert reject([b"ping", header]).reason in {"malformed", "schema"}


def test_unpack_frames_rejects_records_that_are_not_lists_of_bytes():
    with pytest.raises(ProtocolError) as info:
        unpack_frames(msgpack.packb(["kind", 1], use_bin_type=True))
    assert info.value.reason == "malformed"
    with pytest.raises(ProtocolError):
        unpack_frames(msgpack.packb({"a": b"x"}, use_bin_type=True))


# ------------------------------------------------------------------------ semantic checks


def _replace(msg: Message, **changes) -> Message:
    return dataclasses.replace(msg, **changes)


def _traj(**kw) -> Trajectory:
    return make_trajectory(**kw)


def _bad_offsets(last: int) -> Trajectory:
    t = make_trajectory()
    t.prompt_offsets = np.array([0, 5, last], np.int64)
    return t


def _with(t: Trajectory, **changes) -> Trajectory:
    for name, value in changes.items():
        setattr(t, name, value)
    return t


INVALID = {
    "generate_request_empty_prompt": (
        _replace(SAMPLES["generate_request"](), prompt_token_ids=np.zeros(0, np.int32)),
        "empty prompt",
    ),
    "generate_request_2d_prompt": (
        _replace(SAMPLES["generate_request"](), prompt_token_ids=np.zeros((1, 2), np.int32)),
        "empty prompt",
    ),
    "generate_request_int64_prompt": (
        _replace(SAMPLES["generate_request"](), prompt_token_ids=np.array([1, 2], np.int64)),
        "int32",
    ),
    "generate_request_zero_max_tokens": (_replace(SAMPLES["generate_request"](), max_tokens=0), "max_tokens"),
    "generate_request_huge_max_tokens": (_replace(SAMPLES["generate_request"](), max_tokens=4097), "max_tokens"),
    "generate_request_negative_temperature": (_replace(SAMPLES["generate_request"](), temperature=-0.1), "temperature"),
    "generate_request_zero_top_p": (_replace(SAMPLES["generate_request"](), top_p=0.0), "top_p"),
    "generate_response_length_mismatch": (
        _replace(SAMPLES["generate_response"](), logprobs=np.zeros(2, np.float32)),
        "length differ",
    ),
    "assignment_unknown_mode": (_replace(SAMPLES["assignment"](), mode="greedy"), "unknown mode"),
    "nccl_init_rank_offset_zero": (_replace(SAMPLES["nccl_transfer_init"](), rank_offset=0), "rank_offset"),
    "nccl_init_bad_port": (_replace(SAMPLES["nccl_transfer_init"](), master_port=70000), "port"),
    "nccl_update_lengths_differ": (_replace(SAMPLES["nccl_transfer_update"](), shapes=[[1]]), "lengths"),
    "nccl_update_unknown_dtype": (
        _replace(SAMPLES["nccl_transfer_update"](), dtype_names=["int8", "float32"]),
        "dtypes",
    ),
    "weight_chunk_index_equals_count": (_replace(_weight_chunk(), chunk_index=2, num_chunks=2), "chunk"),
    "weight_chunk_negative_index": (_replace(_weight_chunk(), chunk_index=-1), "chunk"),
    "weight_chunk_negative_version": (_replace(_weight_chunk(), version=-1), "negative version"),
    "weight_chunk_tensors_data_mismatch": (_replace(_weight_chunk(), data=[np.zeros(3, np.uint8)]), "tensors/data"),
    "weight_chunk_data_not_uint8": (
        _replace(_weight_chunk(), data=[np.zeros(3, np.uint8), np.zeros(2, np.float16)]),
        "uint8",
    ),
    "trajectory_unknown_mode": (_traj(mode="random"), "unknown mode"),
    "trajectory_without_turns": (_with(_traj(), policy_versions=np.zeros(0, np.int32)), "without turns"),
    "trajectory_offsets_do_not_span_tokens": (_bad_offsets(7), "span"),
    "trajectory_offsets_not_increasing": (
        _with(
            _traj(prompt_lens=(5, 3)),
            prompt_offsets=np.array([0, 8, 8], np.int64),
            prompt_token_ids=np.arange(8, dtype=np.int32),
        ),
        "increasing",
    ),
    "trajectory_offsets_wrong_count": (_with(_traj(), response_offsets=np.array([0, 6], np.int64)), "turns+1"),
    "trajectory_logprobs_length": (_with(_traj(), behaviour_logprobs=np.zeros(5, np.float32)), "logprobs"),
    "trajectory_num_memories_length": (_with(_traj(), num_memories=np.zeros(3, np.int32)), "num_memories"),
    "trajectory_text_lists": (_with(_traj(), actions=["only one"]), "text lists"),
    "trajectory_memory_retrieved_length": (
        _with(_traj(), memory_retrieved=np.zeros(3, np.uint8)),
        "memory_retrieved must be uint8, one per turn",
    ),
    "trajectory_memory_retrieved_dtype": (
        _with(_traj(), memory_retrieved=np.zeros(2, np.int32)),
        "memory_retrieved must be uint8",
    ),
    "trajectory_memory_retrieved_not_0_1": (_with(_traj(), memory_retrieved=np.array([0, 2], np.uint8)), "0 or 1"),
    "trajectory_generated_texts_length": (_with(_traj(), generated_texts=["one"]), "generated_texts"),
    "trajectory_generated_text_too_long": (
        _with(_traj(), generated_texts=["x", "y" * (MAX_GENERATED_TEXT_CHARS + 1)]),
        "longer than",
    ),
    "trajectory_success_without_done": (_with(_traj(score=90.0), done=False, success=True), "success"),
    "trajectory_success_at_70": (_with(_traj(score=70.0), success=True), "success"),
    "trajectory_no_success_at_71": (_with(_traj(score=71.0), success=False), "success"),
    "trajectory_tip_spans_not_k_by_3": (_with(_traj(), tip_spans=np.zeros((1, 2), np.int32)), "[k, 3]"),
    "trajectory_tip_span_turn_out_of_range": (_traj(tip_spans=np.array([[2, 0, 1]], np.int32)), "turn out of range"),
    "trajectory_tip_span_past_prompt_end": (  # turn 1's prompt has 3 tokens
        _traj(tip_spans=np.array([[1, 1, 4]], np.int32)),
        "outside its prompt",
    ),
    "trajectory_tip_span_empty": (_traj(tip_spans=np.array([[0, 2, 2]], np.int32)), "outside its prompt"),
    "trajectory_tip_span_negative_start": (_traj(tip_spans=np.array([[0, -1, 2]], np.int32)), "outside its prompt"),
    "episode_report_empty": (
        _replace(SAMPLES["episode_report"](), observations=[], actions=[]),
        "one observation per action",
    ),
    "episode_report_mismatch": (_replace(SAMPLES["episode_report"](), actions=["a1"]), "one observation per action"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_semantic_validation_failure_is_rejected_as_invalid(case):
    msg, fragment = INVALID[case]
    err = reject(encode(msg))  # encode does not validate; decode must
    assert err.reason == "invalid"
    assert fragment in str(err)


def test_tip_span_at_the_prompt_end_is_valid():
    t = make_trajectory(tip_spans=np.array([[1, 0, 3], [0, 4, 5]], np.int32))
    out = decode(encode(t))
    assert out.turn_tip_spans(1) == [(0, 3)]
    assert out.turn_tip_spans(0) == [(4, 5)]


def test_batch_with_an_invalid_trajectory_is_rejected():
    batch = Batch(trajectories=[make_trajectory(), _bad_offsets(7)], dropped_stale=0)
    assert reject(encode(batch)).reason == "invalid"


# ------------------------------------------------------------------------------------ fuzz


def _mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = list(frames)
    op = rng.randrange(7)
    # mostly the header and buffers: a mangled kind frame is only ever "unknown_kind"
    i = rng.randrange(1, len(frames)) if len(frames) > 1 and rng.random() < 0.9 else 0
    f = bytearray(frames[i])
    if op == 0 and f:  # flip some bytes
        for _ in range(rng.randint(1, 4)):
            f[rng.randrange(len(f))] = rng.randrange(256)
    elif op == 1:  # truncate
        del f[rng.randrange(len(f) + 1) :]
    elif op == 2:  # insert random bytes
        pos = rng.randrange(len(f) + 1)
        f[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    elif op == 3:  # drop a frame
        del frames[i]
        return frames
    elif op == 4:  # duplicate a frame
        frames.insert(i, frames[i])
        return frames
    elif op == 5:  # swap two frames
        j = rng.randrange(len(frames))
        frames[i], frames[j] = frames[j], frames[i]
        return frames
    else:  # replace with random garbage
        f = bytearray(rng.randrange(256) for _ in range(rng.randint(0, 32)))
    frames[i] = bytes(f)
    return frames


def test_fuzzed_frames_decode_or_raise_protocol_error_only():
    rng = random.Random(20240601)
    corpus = [[bytes(f) for f in encode(make())] for make in SAMPLES.values()]
    outcomes = {"decoded": 0, "rejected": 0}
    for _ in range(2000):
        frames = rng.choice(corpus)
        for _ in range(rng.randint(1, 3)):
            if not frames:
                break
            frames = _mutate(rng, frames)
        try:
            msg = decode(frames, max_bytes=1 << 20)
        except ProtocolError as exc:
            assert exc.reason in {"malformed", "too_large", "unknown_kind", "bad_version", "schema", "invalid"}
            outcomes["rejected"] += 1
        else:
            assert isinstance(msg, Message)
            outcomes["decoded"] += 1
    assert outcomes["rejected"] > 1000  # most mutations must be caught
    assert outcomes["decoded"] + outcomes["rejected"] == 2000


def test_weight_file_needs_an_absolute_safetensors_path():
    ok = WeightFile(version=1, path="/dev/shm/w.safetensors", checksum="0" * 32)
    assert decode(encode(ok)) == ok
    for path in ("relative/w.safetensors", "/etc/passwd"):
        assert reject(encode(WeightFile(version=1, path=path, checksum="0" * 32))).reason == "invalid"


def test_trajectory_fields_left_unset_are_derived():
    """A trajectory built (or a record written) without the actor-set fields: retrieval counts as
    answered in the tip modes only, the generated texts are the actions, success is done and > 70."""
    base = make_trajectory(score=90.0)
    for name in ("memory_retrieved", "generated_texts", "success"):
        kwargs = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        kwargs.pop(name)
        for mode, retrieved in ((ON_POLICY, [0, 0]), (OFF_POLICY, [1, 1])):
            t = Trajectory(**{**kwargs, "mode": mode})
            t.validate()
            assert t.memory_retrieved.tolist() == (retrieved if name == "memory_retrieved" else [0, 1])
            assert t.generated_texts == (t.actions if name == "generated_texts" else base.generated_texts)
            assert t.success is True
    # and on the wire: a body without them decodes to the derived values
    frames = with_body(base, lambda body: [body.pop(k) for k in ("generated_texts", "success")])
    out = decode(frames)
    assert out.generated_texts == out.actions and out.success is True


def _chained(spans: list[tuple[int, int, int]]) -> Trajectory:
    """Two turns whose second prompt extends the first prompt and response: [5, 6, 7] + [8] + [9, 10]."""
    turns = [Turn([5, 6, 7], [8]), Turn([5, 6, 7, 8, 9, 10], [11])]
    for turn, start, end in spans:
        turns[turn].tip_spans = (*turns[turn].tip_spans, (start, end))
    t = trajectory(turns)
    t.chain_starts = np.array([1, 0], np.uint8)
    return t


def test_a_chain_round_trips_and_a_record_without_chain_starts_is_every_turn_its_own():
    t = _chained([(0, 1, 2), (1, 1, 2), (1, 4, 5)])  # turn 0's tip kept where it was; a new one after the response
    out = decode(encode(t))
    assert out.chain_starts.tolist() == [1, 0] and out.extends_previous(1)
    # a record written before the field (and before temperatures and response_mask, the arrays after it):
    # their arrays are the message's last three frames
    frames = encode(t)
    header = header_of(frames)
    assert header["body"].pop("chain_starts")["__nd__"] == len(frames) - 5
    assert header["body"].pop("temperatures")["__nd__"] == len(frames) - 4
    assert header["body"].pop("response_mask")["__nd__"] == len(frames) - 3
    old = decode(with_header(frames[:-3], header))
    assert old.chain_starts.tolist() == [1, 1] and old.temperatures.tolist() == [1.0, 1.0]
    assert old.response_mask.tolist() == [1, 1] and old.strategies == ["", ""]


@pytest.mark.parametrize(
    "spans, starts, fragment",
    [
        ([], [0, 0], "1 at turn 0"),
        ([], [1, 2], "0 or 1"),
        ([(0, 1, 2)], [1, 0], "turn 1 is marked as extending turn 0"),  # turn 0's tip not in turn 1's prompt
        ([(0, 1, 2), (1, 0, 2)], [1, 0], "turn 1 is marked"),  # the earlier tip moved
        ([(1, 2, 5)], [1, 0], "turn 1 is marked"),  # a new tip over the previous prompt and response
    ],
)
def test_a_chain_that_does_not_extend_is_refused(spans, starts, fragment):
    t = _chained(spans)
    t.chain_starts = np.array(starts, np.uint8)
    err = reject(encode(t))
    assert err.reason == "invalid" and fragment in str(err)


def test_a_turn_marked_as_extending_a_prompt_it_does_not_start_with_is_refused():
    t = trajectory([Turn([5, 6, 7], [8]), Turn([5, 6, 0, 8, 9], [11])])
    t.chain_starts = np.array([1, 0], np.uint8)
    assert "turn 1 is marked as extending turn 0" in str(reject(encode(t)))
