"""Configuration of the memory service."""

from __future__ import annotations

from dataclasses import dataclass

from common.choices import Choice
from common.config import at_least, within

EMBEDDED_EMBEDDER = "embedded:all-MiniLM-L6-v2"
REFLECTION_SYSTEM = (
    "You review an agent's attempt at a ScienceWorld task and write one short lesson for its next attempt."
)
REFLECTION_INSTRUCTION = (
    "In one sentence of under 100 words, say what happened in this attempt, how far it was from "
    "completing the task, and what to do differently next time."
)


# Which episodes share a memory: one per (task, variation) (the paper), per task, or one for all.
# Functional form: OmegaConf matches members by name, and `global` is a Python keyword.
MemoryKey = Choice(
    "MemoryKey", [("task_variation", "task_variation"), ("task", "task"), ("global", "global")], module=__name__
)


class StateKey(Choice):
    """What text of a state is embedded as its memory key (memory_service.state_key; state_key.py)."""

    observation = "observation"  # the state text as shown (the paper)
    situation = "situation"  # the room and the inventory: tells ScienceWorld's states apart (a departure)


class EmbeddingDtype(Choice):
    """What the embedding forward computes in (memory_service.embedding_dtype)."""

    auto = "auto"  # bfloat16 where the CPU has native bf16 instructions (AVX512-BF16 or AMX), else float32
    float32 = "float32"
    bfloat16 = "bfloat16"  # autocast: the matmuls in bf16 (~1.6x on AVX512-BF16 cores, ~5x slower on AVX2)


@dataclass
class MemoryServiceConfig:
    embedder: str = EMBEDDED_EMBEDDER  # any sentence-transformers model dir/name, or the embedded one
    similarity_threshold: float = 0.5  # cosine similarity a memory must exceed to be retrieved
    top_k: int = 10  # memories returned per query, highest episode score first
    capacity: int = 1000  # FIFO cap per memory
    # MemoryQueries waiting together are embedded in one call, at most this many (1: one by one, which
    # falls far behind many actors: benchmarks/load.py, benchmarks/memory_load.py)
    query_batch: int = 64
    # Recent state texts whose embedding is kept (memory_service/embedder.py; 0 = none): a repeated
    # state is answered without the forward that is 98% of a query's time. 4096 vectors of 384
    # floats are 6 MB.
    embedding_cache: int = 4096
    # A state's first N word pieces are embedded (0: the embedder's own limit, 256 for MiniLM). MiniLM was
    # trained on 128; a forward's cost grows with its length, and long ScienceWorld observations list
    # a room's contents after its name and first objects.
    embedding_max_tokens: int = 128
    embedding_dtype: EmbeddingDtype = EmbeddingDtype.auto  # auto: bf16 where the CPU computes it natively
    key: MemoryKey = MemoryKey.task_variation  # one memory per task_variation | task | global
    # The state's text embedded as its key: observation (the paper: feedback + the room's look text, whose
    # cosines between real states are high whatever the situation: 0.5 passes 65-72% of the pairs of
    # different situations) | situation (room + inventory; with a threshold from benchmarks.state_keys)
    state_key: StateKey = StateKey.observation
    reflection_system: str = REFLECTION_SYSTEM  # system prompt of the reflection request
    reflection_instruction: str = REFLECTION_INSTRUCTION  # closes the user turn, after the attempt
    # The reflection request is the episode as a chat (a user turn per state, an assistant turn per
    # action) closed by the final score and the instruction: the reference shows the whole episode.
    reflection_steps_shown: int = 0  # 0 = every step; N = only the last N
    reflection_state_chars: int = 0  # 0 = states in full; N = each state cut to its first N characters
    # The prompt's token budget: 0 = policy_server.max_model_len - reflection_max_tokens. A longer
    # episode loses its oldest steps first (the prompt says how many); the task and the score stay.
    reflection_prompt_tokens: int = 0
    reflection_max_tokens: int = 128  # the reference's generation cap
    reflection_temperature: float = 1.0  # the rollout temperature, as in the reference
    reflection_timeout_s: float = 300.0  # one reflection's generation, then it is tried again (reflection_attempts)
    reflection_batch_size: int = 8  # episodes reflected on concurrently (the engine batches them)
    # A queued report whose reflection fails (policy servers down, a timeout) is tried again, up to this
    # many times in all, then given up (counted). Queued reports persist in db_file across restarts.
    reflection_attempts: int = 3
    db_file: str = "memory.sqlite"  # inside run_dir; every accepted entry is persisted here

    def reflection_prompt_budget(self, max_model_len: int) -> int:
        """Tokens the reflection prompt may take: reflection_prompt_tokens, or what the policy
        server's context (policy_server.max_model_len) leaves after the reflection itself."""
        return self.reflection_prompt_tokens or max_model_len - self.reflection_max_tokens

    def validate(self) -> None:
        within("similarity_threshold", self.similarity_threshold, -1.0, 1.0)
        at_least("top_k", self.top_k, 1)
        at_least("capacity", self.capacity, 1)
        at_least("query_batch", self.query_batch, 1)
        at_least("embedding_cache", self.embedding_cache, 0)
        at_least("embedding_max_tokens", self.embedding_max_tokens, 0)
        at_least("reflection_steps_shown", self.reflection_steps_shown, 0)
        at_least("reflection_state_chars", self.reflection_state_chars, 0)
        at_least("reflection_prompt_tokens", self.reflection_prompt_tokens, 0)
        at_least("reflection_max_tokens", self.reflection_max_tokens, 1)
        at_least("reflection_temperature", self.reflection_temperature, 0)
        at_least("reflection_batch_size", self.reflection_batch_size, 1)
        at_least("reflection_attempts", self.reflection_attempts, 1)
