"""Every message that crosses a process boundary. Each field says: meaning, producer -> consumer.

Roles: policy server (actors.policy_server), env actor (actors.env_actor), replay buffer
(replay_buffer.service), memory service (memory_service.service), learner (learner.train).
Socket-level conventions (patterns, who binds, timeouts) are in protocol/transport.py and
protocol/README.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from protocol.codec import Message, ProtocolError, register

# Rollout/update modes of EMPO2 (docs/method.md, "Rollout and update modes").
ON_POLICY = "on_policy"  # rollout without tips, update without tips
ON_POLICY_TIPS = "on_policy_tips"  # rollout with tips, update with the same tips in the prompt
OFF_POLICY = "off_policy"  # rollout with tips, update with tips removed from the prompt
MODES = (ON_POLICY, ON_POLICY_TIPS, OFF_POLICY)
TIP_MODES = (ON_POLICY_TIPS, OFF_POLICY)  # the rollouts that retrieve tips and show them
# HeRL (replay_buffer/hindsight.py): a revision of a member of a failed group, replayed with guidance in
# the prompt (its span recorded among the trajectory's tip spans: in-context help, removed at update
# time when herl.train_context=stripped); never drawn as a group's mode
GUIDED = "guided"
EPISODE_MODES = (*MODES, GUIDED)  # every mode an episode is played in
MAX_GUIDANCE_CHARS = 4096
# SGE (actors/env_actor/strategy.py): a turn's strategy text, as the trajectory and the memory keep it
MAX_STRATEGY_CHARS = 2048
# SGE's reflection: the earlier strategies a StrategyResult lists at most
MAX_REFLECTED_STRATEGIES = 32

# An episode is a success when the environment ended it (done) with a score above this: the reference
# wrapper's definition (docs/method.md, "Reference experimental setup").
SUCCESS_SCORE = 70.0
# Trajectory.generated_texts: the env actor keeps at most this many characters of a turn's generation
# (an action is capped at env_actor.max_action_tokens tokens, a few hundred characters at most).
MAX_GENERATED_TEXT_CHARS = 2048
# Trajectory's environment facts, ScienceWorld's own texts cut by the env actor to at most: a room name
# (a word or two), an inventory (info["inv"], a few lines), the goal progress (a table of subgoals, ~1 kB).
MAX_LOCATION_CHARS = 128
MAX_INVENTORY_CHARS = 1024
MAX_GOAL_PROGRESS_CHARS = 4096


# The env actor's timed phases of an episode (Trajectory.phase_seconds)
ROLLOUT_PHASES = ("generation", "env_step", "memory_retrieval", "prompt", "assignment_wait", "memory_report")


def is_success(done: bool, score: float) -> bool:
    return bool(done and score > SUCCESS_SCORE)


def _check(condition: bool, message: str, reason: str = "invalid") -> None:
    if not condition:
        raise ProtocolError(reason, message)


# ---------------------------------------------------------------- semantic limits (issue 14)

# ScienceWorld's scores: 0..100, -100 on a failed goal. A score outside (or NaN) is refused.
SCORE_MIN, SCORE_MAX = -100.0, 100.0
# A behaviour log-prob is <= 0; this much above 0 is float rounding in the engine, not a bad message.
LOGPROB_TOLERANCE = 1e-4
# Ids (episode, group, actor, request), task names, roles, stop strings: short by construction.
MAX_ID_CHARS = 256
MAX_TEMPERATURE = 10.0  # a sampling temperature above this is a mistake, not a setting
MAX_STOP_STRINGS = 16


def _short(*texts: str) -> bool:
    return all(len(t) <= MAX_ID_CHARS for t in texts)


def _vector(arr: np.ndarray, dtype: type, name: str) -> None:
    _check(arr.dtype == dtype and arr.ndim == 1, f"{name} must be {np.dtype(dtype).name}[n]")


def _finite_score(score: float) -> None:
    _check(math.isfinite(score) and SCORE_MIN <= score <= SCORE_MAX, f"score must be in [{SCORE_MIN}, {SCORE_MAX}]")


@dataclass(frozen=True)
class DoorLimits:
    """What a server knows that a message alone does not, from its configuration
    (pipeline/config.py, door_limits): checked at its door by Message.check, after decode's own
    validate(). A refusal is ProtocolError(reason), answered with ErrorReply and counted
    (common/server.py). 0 or empty means "not checked"."""

    vocab_size: int  # token ids must lie in [0, vocab_size): the model's config.json
    tasks: frozenset[str]  # the run's tasks: anything else would become a metric label
    max_turns: int  # turns of an episode: the largest step limit of env
    max_observation_len: int  # characters per observation (Trajectory, EpisodeReport)
    max_action_len: int  # per action
    max_state_len: int  # MemoryQuery.state: embedded per query, the cost of one query
    max_task_description_len: int  # EpisodeReport.task_description

    def texts(self, name: str, texts: list[str], limit: int) -> None:
        if limit:
            _check(all(len(t) <= limit for t in texts), f"{name}: a text over {limit} characters", "too_long")

    def task(self, task: str) -> None:
        _check(not self.tasks or task in self.tasks, f"task {task[:64]!r} is not one of this run's tasks", "task")

    def turns(self, n: int) -> None:
        _check(not self.max_turns or n <= self.max_turns, f"{n} turns > {self.max_turns}", "too_long")

    def token_ids(self, name: str, ids: np.ndarray) -> None:
        if self.vocab_size and ids.size:
            _check(int(ids.max()) < self.vocab_size, f"{name}: a token id >= vocab size {self.vocab_size}", "vocab")


# ------------------------------------------------------------------------------- control


@register
@dataclass
class Ping(Message):
    """Handshake / liveness probe. Any client -> any server."""

    KIND = "ping"
    sender: str  # who asks, for logs

    def validate(self) -> None:
        _check(_short(self.sender), "sender too long")


@register
@dataclass
class Pong(Message):
    """Reply to Ping. Server -> client."""

    KIND = "pong"
    role: str  # "policy_server" | "replay_buffer" | "memory_service"
    policy_version: int  # latest policy version this server knows (-1 if it has none)
    ready: bool  # False while the server is still starting its heavy parts
    # policy server: the run's newest version when it started (protocol/newest_version.py), which it
    # waits for, serving no generation, until a weight update reaches it; 0 = it waits for nothing
    awaiting_version: int = 0
    # seconds since the server's process started (-1: not said). A client that has waited longer than
    # this for a reply knows its request went to an earlier process, and is lost (protocol/transport.py)
    uptime_s: float = -1.0


@register
@dataclass
class ErrorReply(Message):
    """A request was rejected. Any server -> the client that sent it."""

    KIND = "error"
    reason: str  # stable label (ProtocolError.reason or a server-side reason)
    detail: str  # human-readable explanation


@register
@dataclass
class Ack(Message):
    """Generic acknowledgement: the request was accepted (and persisted where the server persists)."""

    KIND = "ack"
    ref: str  # id of what is acknowledged (episode id, ...)
    detail: str = ""
    # True: this exact message (same episode id) was already stored; nothing was stored again. A
    # sender that re-sends after a timeout gets this for the copy that did arrive before. A message
    # that is not stored for any other reason gets ErrorReply, never an Ack.
    duplicate: bool = False


@register
@dataclass
class Wait(Message):
    """Nothing to hand out now; ask again later. Replay buffer -> actor or learner."""

    KIND = "wait"
    retry_after_s: float
    reason: str = ""


# ------------------------------------------------------------------------- generation


@register
@dataclass
class GenerateRequest(Message):
    """One completion. Env actor / memory service -> policy server."""

    KIND = "generate_request"
    request_id: str  # unique per request, echoed in the response
    prompt_token_ids: np.ndarray  # int32 [P], already chat-templated by the caller
    max_tokens: int  # generation cap (32 for actions, 128 for reflections)
    temperature: float  # 1.0 in training, 0.0 for greedy
    seed: int  # per-request seed: identical prompts with identical seeds sample identically
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)  # extra stop strings
    # tokens generated before a stop string or the end of sequence may end it: SGE's action after its
    # strategy (a small model's first token there is often the line break, the action's own stop)
    min_tokens: int = 0

    def validate(self) -> None:
        _check(self.prompt_token_ids.ndim == 1 and self.prompt_token_ids.size > 0, "empty prompt")
        _check(self.prompt_token_ids.dtype == np.int32, "prompt_token_ids must be int32")
        _check(int(self.prompt_token_ids.min()) >= 0, "negative token id")
        _check(0 < self.max_tokens <= 4096, f"max_tokens {self.max_tokens} out of (0, 4096]")
        _check(0 <= self.min_tokens <= self.max_tokens, "min_tokens out of [0, max_tokens]")
        _check(0.0 <= self.temperature <= MAX_TEMPERATURE, f"temperature out of [0, {MAX_TEMPERATURE}]")
        _check(0.0 < self.top_p <= 1.0, "top_p out of (0, 1]")
        _check(_short(self.request_id, *self.stop) and len(self.stop) <= MAX_STOP_STRINGS, "request id or stop strings")

    def check(self, limits: DoorLimits) -> None:
        limits.token_ids("prompt_token_ids", self.prompt_token_ids)


@register
@dataclass
class GenerateResponse(Message):
    """The completion. Policy server -> requester."""

    KIND = "generate_response"
    request_id: str
    token_ids: np.ndarray  # int32 [T] sampled response tokens
    logprobs: np.ndarray  # float32 [T] behaviour log-prob of each sampled token
    text: str  # detokenised response
    policy_version: int  # version of the weights that produced every token (never mixed)
    finish_reason: str  # "stop" | "length" | "abort"
    # the temperature the tokens were sampled at: `logprobs` are of that tempered distribution,
    # log softmax(logits / T), as sampled (vLLM's processed log-probs; T = 0, greedy, reports T = 1)
    temperature: float = 1.0

    def validate(self) -> None:
        _vector(self.token_ids, np.int32, "token_ids")
        _vector(self.logprobs, np.float32, "logprobs")
        _check(self.token_ids.shape == self.logprobs.shape, "token_ids/logprobs length differ")
        _check(0.0 <= self.temperature <= MAX_TEMPERATURE, f"temperature out of [0, {MAX_TEMPERATURE}]")


# ----------------------------------------------------------------------------- weights


@dataclass
class TensorMeta:
    """Name, dtype and shape of one tensor of a weight update."""

    name: str  # HF checkpoint name, e.g. "model.layers.0.self_attn.q_proj.weight"
    dtype: str  # torch dtype name: "float32" | "bfloat16" | "float16"
    shape: list[int]


# WeightChunk/WeightFile.lora_scale: 0 means the tensors are full HF weights. Above 0 they are a
# LoRA adapter only (learner.lora_rank): pairs `<module>.lora_A.weight` [r, in] and
# `<module>.lora_B.weight` [out, r], which the server merges onto its base model as
# W = W0 + lora_scale * B @ A (an adapter-only push: ~1% of the bytes of the full model).


def _check_lora_scale(scale: float) -> None:
    _check(0.0 <= scale < 1e6, "lora_scale must be >= 0 and finite")


@register
@dataclass
class WeightChunk(Message):
    """Part of a weight update: raw tensor bytes as frames. Learner -> policy server.

    An update is `num_chunks` chunks with the same version; the server applies it atomically
    once every chunk has arrived and the checksum of all tensor bytes matches.
    """

    KIND = "weight_chunk"
    version: int  # policy version these weights become
    chunk_index: int  # 0 .. num_chunks-1
    num_chunks: int
    tensors: list[TensorMeta]
    data: list[np.ndarray]  # uint8 [nbytes] per tensor, same order as `tensors`
    checksum: (
        str  # protocol.weight_file.weights_checksum: XXH3-128 hex over all tensors' bytes of the whole update, in order
    )
    lora_scale: float = 0.0  # 0: full weights; > 0: a LoRA adapter the server merges (above WeightChunk)

    def validate(self) -> None:
        _check(self.version >= 0, "negative version")
        _check_lora_scale(self.lora_scale)
        _check(0 <= self.chunk_index < self.num_chunks <= 100_000, "bad chunk index/count")
        _check(len(self.tensors) == len(self.data), "tensors/data length differ")
        _check(all(d.dtype == np.uint8 and d.ndim == 1 for d in self.data), "data must be uint8[n]")
        _check(all(all(n >= 0 for n in t.shape) for t in self.tensors), "negative dimension")


# The messages of each weight_sync.method (a config choice, pipeline/config.py; learner/weight_push.py
# has the details):
#   zmq: WeightChunk frames (any host) | shm: a WeightFile in shared memory (one host)
#   checkpoint: a WeightFile in the learner's checkpoint directory (shared filesystem)
#   nccl: NcclTransferInit/Update control messages, tensors over vLLM's NCCL transfer (GPU hosts)


@register
@dataclass
class WeightFile(Message):
    """A weight update as a safetensors file both sides can read: shared memory (/dev/shm) on one
    host, or a shared filesystem. Learner -> policy server; answered with WeightUpdateAck."""

    KIND = "weight_file"
    version: int  # policy version these weights become
    path: str  # absolute path of a safetensors file of HF-named tensors
    checksum: str  # protocol.weight_file.file_checksum(path), verified by the server before the update goes live
    lora_scale: float = 0.0  # 0: full weights; > 0: a LoRA adapter the server merges (above WeightChunk)

    def validate(self) -> None:
        _check(self.version >= 0, "negative version")
        _check_lora_scale(self.lora_scale)
        _check(
            self.path.startswith("/") and self.path.endswith(".safetensors"),
            "path must be an absolute .safetensors file",
        )


@register
@dataclass
class WeightUpdateAck(Message):
    """Reply to each WeightChunk (`applied` on the last one), WeightFile, NcclTransferInit and
    NcclTransferUpdate. Policy server -> learner."""

    KIND = "weight_update_ack"
    version: int  # the version the server now serves (after the last chunk)
    chunk_index: int
    applied: bool  # True once the whole update is live
    apply_seconds: float = 0.0  # wall time of the in-engine reload


# vLLM's native weight transfer (weight_sync.method=nccl, GPU hosts). The tensors travel over an
# NCCL group of the learner (rank 0) and the server's workers; these messages are its control
# plane. vLLM's trainer engine drives them (learner/weight_push.py, NcclWeightPusher).
NCCL_DTYPES = ("float32", "bfloat16", "float16")


@register
@dataclass
class NcclTransferInit(Message):
    """Join the learner's weight-transfer NCCL group (vLLM's NCCLWeightTransferInitInfo fields).
    Learner -> policy server; answered with WeightUpdateAck(applied=False) once joined."""

    KIND = "nccl_transfer_init"
    master_address: str  # the learner's TCPStore rendezvous
    master_port: int
    rank_offset: int  # this server's first worker rank (the learner is rank 0)
    world_size: int  # learner + this server's workers
    packed: bool  # tensors batched into fixed-size buffers (the wire layout both sides agree on)
    packed_buffer_size_bytes: int
    packed_num_buffers: int

    def validate(self) -> None:
        _check(0 < self.master_port < 65536, "bad port")
        _check(0 < self.rank_offset < self.world_size <= 4096, "bad rank_offset/world_size")
        _check(self.packed_buffer_size_bytes > 0 and self.packed_num_buffers > 0, "bad packed buffer geometry")


@register
@dataclass
class NcclTransferUpdate(Message):
    """Receive one full weight update over NCCL (the learner broadcasts at the same time) and make
    it live as `version`, atomically like every update. Learner -> policy server; answered with
    WeightUpdateAck(applied=True). No byte checksum: NCCL's transport is the integrity layer here,
    and the names/dtypes/shapes below must match the broadcast element for element."""

    KIND = "nccl_transfer_update"
    version: int
    names: list[str]  # HF parameter names, in broadcast order
    dtype_names: list[str]  # one of NCCL_DTYPES per tensor
    shapes: list[list[int]]

    def validate(self) -> None:
        _check(self.version >= 0, "negative version")
        _check(len(self.names) == len(self.dtype_names) == len(self.shapes) > 0, "names/dtypes/shapes lengths differ")
        _check(all(d in NCCL_DTYPES for d in self.dtype_names), f"dtypes must be in {NCCL_DTYPES}")
        _check(all(all(n >= 0 for n in s) for s in self.shapes), "negative dimension")


# --------------------------------------------------------------------- rollouts & buffer


@register
@dataclass
class AssignmentRequest(Message):
    """An actor asks what to play next. Env actor -> replay buffer."""

    KIND = "assignment_request"
    actor_id: str
    # the sending process's incarnation (LeaseRenewal): "" = not said (no restart detection)
    incarnation: str = ""

    def validate(self) -> None:
        _check(_short(self.actor_id, self.incarnation), "actor_id or incarnation too long")


@register
@dataclass
class Assignment(Message):
    """One rollout slot of a GRPO group. Replay buffer -> env actor."""

    KIND = "assignment"
    group_id: str  # the G rollouts of one (task, variation) that share a mode
    slot: int  # 0 .. G-1 within the group
    task: str  # ScienceWorld task name
    variation: int
    mode: str  # one of EPISODE_MODES
    seed: int  # sampling seed base for this rollout
    # GUIDED: what the revised member achieved and missed (replay_buffer/hindsight.py), shown in the prompt
    guidance: str = ""
    # the rollout's sampling temperature; None: the actor's env_actor.temperature (HeRL's guided
    # episodes: herl.temperature)
    temperature: float | None = None
    # SGE: the temperature this member samples its strategies at (the group's members spread over
    # sge.strategy_temperature_min..max); None: no strategies (SGE off)
    strategy_temperature: float | None = None

    def validate(self) -> None:
        _check(self.mode in EPISODE_MODES, f"unknown mode {self.mode!r}")
        _check(self.slot >= 0 and self.variation >= 0, "negative slot or variation")
        _check(bool(self.guidance) == (self.mode == GUIDED), "guidance is given with a guided assignment only")
        _check(len(self.guidance) <= MAX_GUIDANCE_CHARS, f"guidance longer than {MAX_GUIDANCE_CHARS} characters")
        for t in (self.temperature, self.strategy_temperature):
            _check(t is None or 0.0 <= t <= MAX_TEMPERATURE, f"temperature out of [0, {MAX_TEMPERATURE}]")


@register
@dataclass
class AssignmentReturn(Message):
    """An actor stopping gracefully gives back a slot it will not finish, so the buffer hands it
    out again at once instead of after replay_buffer.assignment_timeout_s. Env actor -> replay
    buffer; answered with Ack (also when the slot was already filled or re-issued)."""

    KIND = "assignment_return"
    group_id: str
    slot: int
    actor_id: str
    incarnation: str = ""  # the returning process's (LeaseRenewal); "": not said

    def validate(self) -> None:
        _check(_short(self.group_id, self.actor_id, self.incarnation), "an id is too long")
        _check(self.slot >= 0, "negative slot")


@register
@dataclass
class LeaseRenewal(Message):
    """The keep-alive of an assignment: an actor's process renews the slot each of its envs plays,
    every env_actor.lease_renew_s, from a thread of its own (actors/env_actor/lease.py), so a slot is
    leased for as long as its actor lives, not for as long as a turn may take. Without a renewal for
    replay_buffer.lease_ttl_s the lease lapses and the slot is handed out again. Env actor -> replay
    buffer; answered with Ack, or ErrorReply(lease_lost) when the slot is no longer this actor's (it
    lapsed and went to another actor, another episode filled it, or the buffer restarted without its
    group): the actor then drops the episode.

    `incarnation` is a random id each actor process draws at its start and sends with its
    AssignmentRequests, returns and renewals: a restarted actor (the same actor_id, a new
    incarnation) releases every lease its predecessor held at its first message, at once.
    group_id "" renews nothing: it only announces the incarnation (an actor that has no slot yet)."""

    KIND = "lease_renewal"
    actor_id: str
    incarnation: str
    group_id: str = ""
    slot: int = 0

    def validate(self) -> None:
        _check(bool(self.incarnation), "incarnation is empty")
        _check(_short(self.actor_id, self.incarnation, self.group_id), "an id is too long")
        _check(self.slot >= 0, "negative slot")


@dataclass
class TurnRecord:
    """One turn as it was played, before Trajectory.from_turns packs the turns into its offset arrays
    (the one place that does: the env actor, the benchmarks and the tests build trajectories so)."""

    prompt_ids: np.ndarray  # the exact tokens the policy server saw
    response_ids: np.ndarray
    logprobs: np.ndarray  # the behaviour policy's, one per response token
    observation: str = ""
    action: str = ""
    policy_version: int = 0
    tip_spans: Sequence[tuple[int, int]] = ()  # (start, end) in this turn's prompt
    num_memories: int = 0
    memory_retrieved: bool | None = None  # None: derived from the mode (Trajectory.memory_retrieved)
    generated_text: str | None = None  # None: the action
    chain_start: bool = True  # the prompt does not extend the previous turn's prompt and response
    location: str = ""  # the room after the action (Trajectory.locations)
    inventory: str = ""  # the inventory after the action (Trajectory.inventories)
    temperature: float = 1.0  # the response's sampling temperature (GenerateResponse.temperature)
    # a response in parts (SGE: strategy, then action): per token, where they differ from the above
    temperatures: np.ndarray | None = None  # float32 [T]; None: `temperature` for every token
    response_mask: np.ndarray | None = None  # uint8 [T]; None: every token sampled
    strategy: str = ""  # SGE: the strategy written at this turn ("" if none)


@register
@dataclass
class Trajectory(Message):
    """A finished episode, turn by turn. Env actor -> replay buffer -> learner.

    Turn i's prompt is prompt_token_ids[prompt_offsets[i]:prompt_offsets[i+1]] (the exact tokens
    the policy server saw), its response likewise with response_offsets. tip_spans rows are
    (turn, start, end): token positions, relative to that turn's prompt, of a <tip> block; the
    learner deletes them for the off-policy update.
    """

    KIND = "trajectory"
    episode_id: str
    group_id: str
    slot: int
    actor_id: str
    task: str
    variation: int
    mode: str  # one of MODES
    score: float  # final ScienceWorld score, 0..100 (-100 on a failed goal)
    done: bool  # the environment ended the episode (else the step limit did)
    prompt_token_ids: np.ndarray  # int32 [sum P_i]
    prompt_offsets: np.ndarray  # int64 [turns+1]
    response_token_ids: np.ndarray  # int32 [sum T_i]
    response_offsets: np.ndarray  # int64 [turns+1]
    behaviour_logprobs: np.ndarray  # float32 [sum T_i], from the policy server
    tip_spans: np.ndarray  # int32 [k, 3] rows (turn, start, end)
    policy_versions: np.ndarray  # int32 [turns] version that generated each turn's action
    num_memories: np.ndarray  # int32 [turns] memories retrieved for each turn (intrinsic reward)
    observations: list[str]  # the state text at each turn
    actions: list[str]  # the (valid) action executed at each turn
    # The fields below are set by the env actor; left None at construction (a record written before
    # they existed, a hand-built test trajectory) they are derived in __post_init__ as noted.
    # uint8 [turns]: 1 = the turn's retrieval answered (num_memories is its count, possibly 0); 0 = it
    # failed or timed out, or the mode shows no tips (the learner gives such turns no intrinsic reward).
    # Derived: 1 on every turn of a tip mode, 0 otherwise.
    memory_retrieved: np.ndarray | None = None
    # The raw generated text of each turn (actions holds the valid action it was mapped to), at most
    # MAX_GENERATED_TEXT_CHARS each. Derived: a copy of actions.
    generated_texts: list[str] | None = None
    # done and score > SUCCESS_SCORE (the reference wrapper's definition of a solved episode). Derived
    # from done and score; validate() checks it agrees with them.
    success: bool | None = None
    # The env actor's wall seconds of this episode per phase (ROLLOUT_PHASES: generation, env_step,
    # memory_retrieval, prompt, and around it assignment_wait and the previous episode's memory_report):
    # the learner's metrics log sums them per step (the paper's Figure 12). Derived: {} (not measured).
    phase_seconds: dict[str, float] | None = None
    # uint8 [turns]: 1 where turn i's prompt starts a new chain, 0 where it extends turn i-1's prompt and
    # response token for token (actors/env_actor/prompts.py), with turn i-1's tip spans as they were and any new one
    # after that response: the learner scores such turns in one sequence (learner.packing). Always 1 at turn
    # 0; 1 again where the actor trimmed the history. Derived: 1 on every turn (each its own sequence).
    chain_starts: np.ndarray | None = None
    # The environment's facts, for what reads the env's state besides the texts (the learner's exploration
    # metrics, learner/exploration.py; SPA's state before and after each action; HeRL's goal progress).
    # Per turn, after its action: the room the agent is in (ScienceWorld's "This room is called the X.", at
    # most MAX_LOCATION_CHARS) and its inventory (info["inv"], at most MAX_INVENTORY_CHARS). The state
    # before turn i is turn i-1's; before turn 0, the room of observations[0] and start_inventory.
    # Derived: "" per turn (not recorded).
    locations: list[str] | None = None
    inventories: list[str] | None = None
    start_inventory: str = ""  # the inventory at reset (some tasks start with one), at most MAX_INVENTORY_CHARS
    # At the episode's end: ScienceWorld's goal progress (env.get_goal_progress(): its subgoals, each done
    # or not), at most MAX_GOAL_PROGRESS_CHARS. "": not recorded.
    goal_progress: str = ""
    # float32 [sum T_i], like behaviour_logprobs: the temperature each response token was sampled at (one per
    # turn today; a method sampling parts of a response at other temperatures records them token by token);
    # its behaviour log-prob is of that tempered distribution, and the learner scores it at the same
    # temperature (learner/policy_model.py), so the ratio compares like with like. 0 (greedy) is scored at 1,
    # as vLLM reports it. Derived: 1.0 per token.
    temperatures: np.ndarray | None = None
    # HeRL, set by the replay buffer when it closes a guided group (replay_buffer/hindsight.py), never by
    # an actor (its door refuses them): `hindsight`, this guided episode took a slot of its group and its
    # tokens train as hindsight tokens; `score_bonus`, this member's reward moves by α (r_guided − r),
    # the "potential for improvement" of its revision
    hindsight: bool = False
    score_bonus: float = 0.0
    # uint8 [sum T_i], like behaviour_logprobs: 1 where the policy sampled the token, 0 where the actor put
    # it in (SGE's glue: the strategy's opening and closing tags and the line break before the action,
    # actors/env_actor/strategy.py). A 0 token is part of the chain the model read but is never trained or
    # judged: its behaviour log-prob is 0 and means nothing. Derived: 1 per token.
    response_mask: np.ndarray | None = None
    # SGE: each turn's strategy ("" where the turn wrote none), at most MAX_STRATEGY_CHARS, and the
    # temperature this episode sampled its strategies at (0: no strategies). Derived: "" per turn.
    strategies: list[str] | None = None
    strategy_temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.phase_seconds is None:
            self.phase_seconds = {}
        if self.chain_starts is None:
            self.chain_starts = np.ones(self.num_turns, np.uint8)
        if self.memory_retrieved is None:
            self.memory_retrieved = np.full(self.num_turns, int(self.mode in TIP_MODES), np.uint8)
        if self.generated_texts is None:
            self.generated_texts = list(self.actions)
        if self.success is None:
            self.success = is_success(self.done, self.score)
        if self.locations is None:
            self.locations = [""] * self.num_turns
        if self.inventories is None:
            self.inventories = [""] * self.num_turns
        if self.temperatures is None:
            self.temperatures = np.ones(self.response_token_ids.size, np.float32)
        if self.response_mask is None:
            self.response_mask = np.ones(self.response_token_ids.size, np.uint8)
        if self.strategies is None:
            self.strategies = [""] * self.num_turns

    @property
    def num_turns(self) -> int:
        return len(self.policy_versions)

    @classmethod
    def from_turns(cls, turns: Sequence[TurnRecord], **episode) -> Trajectory:
        """A trajectory of `turns`, with the episode's own fields (episode_id, group_id, slot,
        actor_id, task, variation, mode, score, done; optionally success, phase_seconds,
        start_inventory, goal_progress)."""

        def packed(arrays, dtype) -> tuple[np.ndarray, np.ndarray]:
            offsets = np.concatenate([[0], np.cumsum([len(x) for x in arrays])]).astype(np.int64)
            return np.concatenate([np.asarray(x, dtype) for x in arrays]), offsets

        prompts, prompt_offsets = packed([t.prompt_ids for t in turns], np.int32)
        responses, response_offsets = packed([t.response_ids for t in turns], np.int32)
        return cls(
            **episode,
            prompt_token_ids=prompts,
            prompt_offsets=prompt_offsets,
            response_token_ids=responses,
            response_offsets=response_offsets,
            behaviour_logprobs=packed([t.logprobs for t in turns], np.float32)[0],
            tip_spans=np.asarray([(i, s, e) for i, t in enumerate(turns) for s, e in t.tip_spans], np.int32).reshape(
                -1, 3
            ),
            policy_versions=np.asarray([t.policy_version for t in turns], np.int32),
            num_memories=np.asarray([t.num_memories for t in turns], np.int32),
            observations=[t.observation for t in turns],
            actions=[t.action for t in turns],
            memory_retrieved=None
            if any(t.memory_retrieved is None for t in turns)
            else np.asarray([t.memory_retrieved for t in turns], np.uint8),
            generated_texts=[t.action if t.generated_text is None else t.generated_text for t in turns],
            chain_starts=np.asarray([t.chain_start for t in turns], np.uint8),
            locations=[t.location for t in turns],
            inventories=[t.inventory for t in turns],
            temperatures=packed(
                [
                    np.full(len(t.response_ids), t.temperature) if t.temperatures is None else t.temperatures
                    for t in turns
                ],
                np.float32,
            )[0],
            response_mask=packed(
                [np.ones(len(t.response_ids)) if t.response_mask is None else t.response_mask for t in turns], np.uint8
            )[0],
            strategies=[t.strategy for t in turns],
        )

    def validate(self) -> None:
        """Everything the learner's sample building assumes (learner/samples.py): a message that
        passes cannot raise there or put a non-finite value into the loss."""
        _check(self.mode in EPISODE_MODES, f"unknown mode {self.mode!r}")
        _check(_short(self.episode_id, self.group_id, self.actor_id, self.task), "an id or the task is too long")
        _check(not self.hindsight or self.mode == GUIDED, "only a guided episode trains as hindsight")
        _check(abs(self.score_bonus) <= SCORE_MAX - SCORE_MIN, "score_bonus must be finite and within the score range")
        _check(self.slot >= 0 and self.variation >= 0, "negative slot or variation")
        _finite_score(self.score)
        for name in ("prompt_token_ids", "response_token_ids", "policy_versions", "num_memories"):
            _vector(getattr(self, name), np.int32, name)
        _check(self.tip_spans.dtype == np.int32, "tip_spans must be int32")
        _vector(self.behaviour_logprobs, np.float32, "behaviour_logprobs")
        n = self.num_turns
        _check(n > 0, "trajectory without turns")
        for name in ("prompt_token_ids", "response_token_ids"):
            arr = getattr(self, name)
            _check(arr.size == 0 or int(arr.min()) >= 0, f"{name}: negative token id")
        _check(int(self.policy_versions.min()) >= 0, "negative policy version")
        _check(self.num_memories.size == 0 or int(self.num_memories.min()) >= 0, "negative num_memories")
        logprobs = self.behaviour_logprobs
        _check(bool(np.isfinite(logprobs).all()), "behaviour_logprobs must be finite")
        _check(logprobs.size == 0 or float(logprobs.max()) <= LOGPROB_TOLERANCE, "behaviour_logprobs must be <= 0")
        for name, arr, size in (
            ("prompt_offsets", self.prompt_offsets, self.prompt_token_ids.size),
            ("response_offsets", self.response_offsets, self.response_token_ids.size),
        ):
            _check(arr.dtype == np.int64, f"{name} must be int64")
            _check(arr.shape == (n + 1,), f"{name} must have turns+1 entries")
            _check(arr[0] == 0 and arr[-1] == size, f"{name} must span its token array")
            _check(bool((arr[1:] > arr[:-1]).all()), f"{name} must be strictly increasing")
        _check(self.behaviour_logprobs.shape == self.response_token_ids.shape, "logprobs length")
        _check(self.num_memories.shape == (n,), "num_memories must have one entry per turn")
        _check(len(self.observations) == n and len(self.actions) == n, "text lists per turn")
        retrieved = self.memory_retrieved
        _check(retrieved.dtype == np.uint8 and retrieved.shape == (n,), "memory_retrieved must be uint8, one per turn")
        _check(bool(np.all(retrieved <= 1)), "memory_retrieved must be 0 or 1")
        _check(len(self.generated_texts) == n, "generated_texts must have one entry per turn")
        _check(
            all(len(text) <= MAX_GENERATED_TEXT_CHARS for text in self.generated_texts),
            f"a generated text is longer than {MAX_GENERATED_TEXT_CHARS} characters",
        )
        _check(self.success == is_success(self.done, self.score), "success must be done and score > SUCCESS_SCORE")
        _check(len(self.locations) == n and len(self.inventories) == n, "locations and inventories: one per turn")
        temps = self.temperatures
        _check(
            temps.dtype == np.float32 and temps.shape == self.response_token_ids.shape,
            "temperatures must be float32, one per response token",
        )
        _check(
            bool(np.all((temps >= 0) & (temps <= MAX_TEMPERATURE))), f"temperatures must be in [0, {MAX_TEMPERATURE}]"
        )
        mask = self.response_mask
        _check(
            mask.dtype == np.uint8 and mask.shape == self.response_token_ids.shape and bool(np.all(mask <= 1)),
            "response_mask must be uint8, 0 or 1, one per response token",
        )
        _check(
            len(self.strategies) == n and all(len(s) <= MAX_STRATEGY_CHARS for s in self.strategies),
            f"strategies: one per turn, at most {MAX_STRATEGY_CHARS} characters each",
        )
        _check(0.0 <= self.strategy_temperature <= MAX_TEMPERATURE, "strategy_temperature out of range")
        for name, texts, limit in (
            ("a location", self.locations, MAX_LOCATION_CHARS),
            ("an inventory", [*self.inventories, self.start_inventory], MAX_INVENTORY_CHARS),
            ("the goal progress", [self.goal_progress], MAX_GOAL_PROGRESS_CHARS),
        ):
            _check(all(len(text) <= limit for text in texts), f"{name} is longer than {limit} characters")
        _check(
            all(k in ROLLOUT_PHASES and 0 <= v < float("inf") for k, v in self.phase_seconds.items()),
            f"phase_seconds keys must be of {ROLLOUT_PHASES}, their seconds finite and >= 0",
        )
        spans = self.tip_spans
        _check(spans.ndim == 2 and spans.shape[1] == 3, "tip_spans must be [k, 3]")
        for turn, start, end in spans.tolist():
            _check(0 <= turn < n, "tip span turn out of range")
            plen = int(self.prompt_offsets[turn + 1] - self.prompt_offsets[turn])
            _check(0 <= start < end <= plen, "tip span outside its prompt")
        starts = self.chain_starts
        _check(starts.dtype == np.uint8 and starts.shape == (n,), "chain_starts must be uint8, one per turn")
        _check(bool(np.all(starts <= 1)) and starts[0] == 1, "chain_starts must be 0 or 1, and 1 at turn 0")
        for i in np.flatnonzero(starts == 0).tolist():
            _check(self.extends_previous(i), f"turn {i} is marked as extending turn {i - 1}, but does not")

    def extends_previous(self, i: int) -> bool:
        """Turn i's prompt starts with turn i-1's prompt and response, token for token; the tip spans of
        turn i-1 are turn i's within that prefix, and turn i's others start after it (so removing the
        tips keeps the chain a chain)."""
        before = np.concatenate([self.turn_prompt(i - 1), self.turn_response(i - 1)])
        prompt = self.turn_prompt(i)
        if len(prompt) < len(before) or not np.array_equal(prompt[: len(before)], before):
            return False
        plen = len(self.turn_prompt(i - 1))
        earlier = [(s, e) for s, e in self.turn_tip_spans(i) if s < len(before)]
        return earlier == self.turn_tip_spans(i - 1) and all(e <= plen for _, e in earlier)

    def check(self, limits: DoorLimits) -> None:
        limits.task(self.task)
        limits.turns(self.num_turns)
        limits.token_ids("prompt_token_ids", self.prompt_token_ids)
        limits.token_ids("response_token_ids", self.response_token_ids)
        limits.texts("observations", self.observations, limits.max_observation_len)
        limits.texts("actions", self.actions, limits.max_action_len)

    def turn_prompt(self, i: int) -> np.ndarray:
        return self.prompt_token_ids[self.prompt_offsets[i] : self.prompt_offsets[i + 1]]

    def turn_response(self, i: int) -> np.ndarray:
        return self.response_token_ids[self.response_offsets[i] : self.response_offsets[i + 1]]

    def turn_behaviour_logprobs(self, i: int) -> np.ndarray:
        return self.behaviour_logprobs[self.response_offsets[i] : self.response_offsets[i + 1]]

    def turn_temperatures(self, i: int) -> np.ndarray:
        return self.temperatures[self.response_offsets[i] : self.response_offsets[i + 1]]

    def turn_response_mask(self, i: int) -> np.ndarray:
        return self.response_mask[self.response_offsets[i] : self.response_offsets[i + 1]]

    def inventories_before(self) -> list[str]:
        """What the agent carried in each turn's state, before its action: turn i-1's inventory after its
        action, start_inventory before turn 0."""
        return [self.start_inventory, *self.inventories[:-1]]

    def turn_tip_spans(self, i: int) -> list[tuple[int, int]]:
        return [(s, e) for t, s, e in self.tip_spans.tolist() if t == i]


@register
@dataclass
class BatchRequest(Message):
    """The learner asks for complete groups. Learner -> replay buffer."""

    KIND = "batch_request"
    learner_version: int  # the learner's current policy version
    num_groups: int  # groups wanted
    max_staleness: int  # drop groups whose oldest turn is older than learner_version - this
    # The learner's message limit: every Batch part is at most this many bytes encoded (0: the
    # protocol's DEFAULT_MAX_MESSAGE_BYTES).
    max_bytes: int = 0
    # "" asks for a new batch (and tells the buffer that a batch still unconfirmed will never be:
    # the learner restarted, its groups are re-served). A batch id asks for part `part` of that
    # batch, served before and not yet confirmed (the same part again if asked again).
    batch_id: str = ""
    part: int = 0
    # the learner's token (security.learner_token): when the buffer has one, it serves only requests with it
    token: str = ""

    def validate(self) -> None:
        _check(self.learner_version >= 0 and self.max_staleness >= 0, "negative version or staleness")
        _check(0 < self.num_groups <= 100_000, "num_groups out of (0, 100000]")
        _check(self.max_bytes >= 0 and self.part >= 0, "max_bytes and part must be >= 0")
        _check(_short(self.token) and _short(self.batch_id), "token or batch_id too long")


# A Batch's bytes beyond its trajectories' own encodings (its fields, the list around them): the
# buffer packs a batch's parts to the learner's max_bytes less this.
BATCH_ENVELOPE_BYTES = 64 * 1024


@register
@dataclass
class Batch(Message):
    """Complete groups, oldest first. Replay buffer -> learner."""

    KIND = "batch"
    trajectories: list[Trajectory]
    dropped_stale: int  # groups dropped for staleness since the previous batch
    # A batch is one or more parts (each within the learner's max_bytes); the learner asks for
    # parts 1..num_parts-1 by batch_id, steps on all of them together, then sends BatchConfirm.
    batch_id: str = ""
    part: int = 0
    num_parts: int = 1

    def validate(self) -> None:
        _check(self.dropped_stale >= 0, "negative dropped_stale")
        _check(0 <= self.part < self.num_parts, "part outside 0..num_parts-1")
        _check(_short(self.batch_id), "batch_id too long")


@register
@dataclass
class BatchConfirm(Message):
    """The learner has stepped on the batch: its groups are used and never served again.
    Learner -> replay buffer; answered with Ack (also for a batch already confirmed, or one
    re-served since: detail says so). Until it arrives a batch's groups stay the buffer's."""

    KIND = "batch_confirm"
    batch_id: str

    def validate(self) -> None:
        _check(bool(self.batch_id) and _short(self.batch_id), "batch_id empty or too long")


# ------------------------------------------------------------------------------- memory


@register
@dataclass
class MemoryQuery(Message):
    """Which memories fit this state? Env actor -> memory service."""

    KIND = "memory_query"
    task: str
    variation: int
    state: str  # current observation text, embedded by the service
    # what the agent carries in this state (ScienceWorld's inventory text): part of the situation key
    # (memory_service.state_key=situation); "" from a peer that does not send it
    inventory: str = ""

    def validate(self) -> None:
        _check(_short(self.task) and self.variation >= 0, "task too long or negative variation")
        _check(len(self.inventory) <= MAX_INVENTORY_CHARS, f"inventory longer than {MAX_INVENTORY_CHARS} characters")

    def check(self, limits: DoorLimits) -> None:
        limits.task(self.task)
        limits.texts("state", [self.state], limits.max_state_len)


@register
@dataclass
class MemoryResult(Message):
    """Retrieved tips, best episode score first. Memory service -> env actor."""

    KIND = "memory_result"
    tips: list[str]
    scores: list[float]  # stored episode score of each tip
    count: int  # n for the intrinsic reward 1/(n+1)

    def validate(self) -> None:
        _check(len(self.tips) == len(self.scores) and self.count >= 0, "tips/scores length differ")
        _check(all(math.isfinite(s) for s in self.scores), "scores must be finite")


@register
@dataclass
class EpisodeReport(Message):
    """A finished episode to reflect on and store. Env actor -> memory service."""

    KIND = "episode_report"
    episode_id: str
    task: str
    variation: int
    task_description: str
    score: float
    observations: list[str]  # state at each step: the retrieval keys
    actions: list[str]  # action taken at each step
    # what the agent carried in each observed state (before its action): the situation key's part
    # (memory_service.state_key=situation); [] from a peer that does not send them
    inventories: list[str] = field(default_factory=list)
    # SGE: the episode's opening strategy, stored with its score for the reflection of later groups
    # (StrategyQuery); "": none. `reflect`: write tips on it (EMPO2's memory in use), else only the strategy
    strategy: str = ""
    strategy_temperature: float = 0.0
    reflect: bool = True

    def validate(self) -> None:
        _check(len(self.observations) == len(self.actions) > 0, "one observation per action")
        _check(len(self.inventories) in (0, len(self.actions)), "one inventory per observation, or none")
        _check(all(len(i) <= MAX_INVENTORY_CHARS for i in self.inventories), "an inventory is too long")
        _check(len(self.strategy) <= MAX_STRATEGY_CHARS, f"strategy longer than {MAX_STRATEGY_CHARS} characters")
        _check(0.0 <= self.strategy_temperature <= MAX_TEMPERATURE, "strategy_temperature out of range")
        _check(_short(self.episode_id, self.task) and self.variation >= 0, "id or task too long, or negative variation")
        _finite_score(self.score)

    def check(self, limits: DoorLimits) -> None:
        limits.task(self.task)
        limits.turns(len(self.actions))
        limits.texts("observations", self.observations, limits.max_observation_len)
        limits.texts("actions", self.actions, limits.max_action_len)
        limits.texts("task_description", [self.task_description], limits.max_task_description_len)


@register
@dataclass
class StrategyQuery(Message):
    """SGE's reflection for a group: the earlier strategies of its task with their scores. Every member
    of a group asks with the group's id and gets the same answer (the first member's, kept by the
    service), so the group shares its context as GRPO's advantage assumes. Env actor -> memory service."""

    KIND = "strategy_query"
    group_id: str
    task: str
    variation: int

    def validate(self) -> None:
        _check(_short(self.group_id, self.task) and self.variation >= 0, "id or task too long, or negative variation")

    def check(self, limits: DoorLimits) -> None:
        limits.task(self.task)


@register
@dataclass
class StrategyResult(Message):
    """The best and the most recent earlier strategies of the task, each with the score of the episode
    that followed it. Memory service -> env actor."""

    KIND = "strategy_result"
    strategies: list[str]
    scores: list[float]

    def validate(self) -> None:
        _check(len(self.strategies) == len(self.scores) <= MAX_REFLECTED_STRATEGIES, "strategies/scores")
        _check(all(len(s) <= MAX_STRATEGY_CHARS for s in self.strategies), "a strategy is too long")
        _check(all(math.isfinite(s) for s in self.scores), "scores must be finite")
