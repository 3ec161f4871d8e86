"""The env actor's section (`env_actor`): how episodes are played and prompted, and how the actor
talks to the servers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common.choices import Choice
from common.config import at_least, positive
from protocol.messages import GenerateRequest


class ServerSelection(Choice):
    least_loaded = "least_loaded"  # the server with the fewest requests in flight from this process
    round_robin = "round_robin"


@dataclass
class EnvActorConfig:
    index: int = 0  # this actor's number (set per process): its id and metrics port
    envs_per_actor: int = 1  # ScienceWorld envs (one JVM and one thread each) played concurrently by one process
    server_selection: ServerSelection = ServerSelection.least_loaded  # least_loaded | round_robin
    # The prompt (actors/env_actor/prompts.py): the reference's, adapted from RLVMR. A system part (instructions,
    # the task, one expert demonstration, the env's action templates), then the episode as a chat.
    history_window: int = 0  # past turns shown: 0 = all (the reference), N = the last N
    # The prompt's token limit: 0 = policy_server.max_model_len - max_action_tokens. Past it the oldest
    # turns are left out first (the prompt says how many); the system part and the current turn stay.
    prompt_token_budget: int = 0
    demonstration: bool = True  # the gold action sequence of another training variation of the task
    demo_max_steps: int = 0  # the demonstration's first N actions; 0 = all of them
    max_action_tokens: int = 32  # generation cap for an action
    # Stop generating at the first newline: an action is one line, and a small model otherwise goes on
    # to write the next observation or more actions until the token cap, which costs generation time.
    # The reference stops only at the cap (32 tokens) and maps the whole text. The executed action
    # comes from the first line either way (unless a generation opens with a newline); the behaviour
    # tokens differ. The raw text is kept in Trajectory.generated_texts either way.
    stop_at_newline: bool = True
    temperature: float = 1.0  # sampling temperature in training (0.4 at evaluation)
    generate_timeout_s: float = 300.0  # one action generation; generous for CPU start-up
    memory_timeout_s: float = 5.0  # retrieval; after it, the turn goes without tips (counted)
    memory_retry_after_s: float = 30.0  # after a failed retrieval, go without tips at once for this long
    buffer_timeout_s: float = 30.0  # assignment request / trajectory upload / lease renewal, per try
    # how often the actor's keep-alive thread renews the slots its envs play (actors/env_actor/lease.py);
    # at most a third of replay_buffer.lease_ttl_s (checked at load)
    lease_renew_s: float = 20.0
    # after a generation timed out on a policy server (down or hung), requests go to the others for this long
    policy_retry_after_s: float = 60.0
    upload_retries: int = 20  # a finished episode is retried this often before the actor fails

    def prompt_budget(self, max_model_len: int, response_tokens: int | None = None) -> int:
        """Tokens an action prompt may take: prompt_token_budget, or what the policy server's
        context (policy_server.max_model_len) leaves after the response (`response_tokens`, a turn
        format's cap; default the action's)."""
        return self.prompt_token_budget or max_model_len - (response_tokens or self.max_action_tokens)

    def action_request(
        self,
        request_id: str,
        prompt_ids: np.ndarray,
        seed: int,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        min_tokens: int = 0,
    ) -> GenerateRequest:
        """The request for one action, as every env actor sends it (and the benchmarks measure it):
        the action's token cap, the newline stop when stop_at_newline, `temperature` or this
        section's. Another response (a turn format's, SGE's strategy) gives its own cap and stops."""
        return GenerateRequest(
            request_id=request_id,
            prompt_token_ids=prompt_ids,
            max_tokens=self.max_action_tokens if max_tokens is None else max_tokens,
            temperature=self.temperature if temperature is None else temperature,
            seed=seed,
            stop=list(stop) if stop is not None else ["\n"] if self.stop_at_newline else [],
            min_tokens=min_tokens,
        )

    def validate(self) -> None:
        at_least("index", self.index, 0)
        at_least("envs_per_actor", self.envs_per_actor, 1)
        at_least("history_window", self.history_window, 0)
        at_least("prompt_token_budget", self.prompt_token_budget, 0)
        at_least("demo_max_steps", self.demo_max_steps, 0)
        at_least("max_action_tokens", self.max_action_tokens, 1)
        at_least("temperature", self.temperature, 0)
        at_least("upload_retries", self.upload_retries, 1)
        for name in ("generate_timeout_s", "memory_timeout_s", "buffer_timeout_s", "lease_renew_s"):
            positive(name, getattr(self, name))
        at_least("memory_retry_after_s", self.memory_retry_after_s, 0)
        at_least("policy_retry_after_s", self.policy_retry_after_s, 0)
