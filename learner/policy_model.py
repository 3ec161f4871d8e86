"""The trainable policy: a plain HF causal LM, scored only where it matters.

The vocabulary projection is applied to the response positions alone: over a ~500-token prompt
and a ≤32-token response that avoids >90% of the lm_head work and of the [L, V] logits memory.

What one forward scores (learner/step.py forms them): a batch of rows, right-padded; a row is one
or more token sequences, each with the spans (its turns' responses) to score. A row of one
sequence is a plain causal row. A row of several lays out their longest common prefix once and
then each sequence's remainder as a branch that attends to the prefix and to itself only, at the
positions it has in its own sequence: every scored row is then exactly what the sequence's own
forward gives, with the shared prefix (a group's system part and first turns) computed once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def load_policy(model_path: str, device: str | torch.device):  # the learner's resolved device
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # SDPA takes the boolean 4D mask of a shared-prefix row (eager attention adds float masks only)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return model.to(device), tokenizer


class ResponseScorer(torch.nn.Module):
    """The causal LM as one module whose forward applies the vocabulary projection at the given
    rows only. One forward is what FSDP needs (learner/distributed.py): the root unit (embeddings,
    norm, tied lm_head) is gathered around it."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        rows: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        inverse_temperature: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B, L] ids, a [B, L] padding mask or a [B, 1, L, L] boolean attention mask, [N] rows of
        the flattened [B*L] positions -> [N, V] log-softmax, of the logits times
        `inverse_temperature` [N] when given (each row at the temperature it was sampled at)."""
        hidden = self.lm.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state  # [B, L, H]
        logits = self.lm.get_output_embeddings()(hidden.flatten(0, 1)[rows]).float()  # [N, V]
        if inverse_temperature is not None:
            logits = logits * inverse_temperature[:, None]
        return torch.log_softmax(logits, dim=-1)


@dataclass
class Scored:
    """A token sequence and the spans of it whose tokens are scored: (start, length) each, a
    turn's response inside its segment's chain (learner/step.py), each token at the temperature it
    was sampled at (None: all at 1)."""

    tokens: np.ndarray  # int [L]
    spans: list[tuple[int, int]]
    temperatures: list[np.ndarray | None] | None = None  # per span: [length] float32, or None (all at 1)

    @property
    def tempered(self) -> bool:
        return any(t is not None and bool(np.any(t != 1.0)) for t in self.temperatures or [])

    def inverse_temperatures(self) -> np.ndarray:
        """[ΣT] 1 / the temperature of each scored token, span after span."""
        temps = self.temperatures or [None] * len(self.spans)
        parts = [
            np.ones(n, np.float32) if t is None else 1.0 / np.asarray(t, np.float32)
            for (_, n), t in zip(self.spans, temps)
        ]
        return np.concatenate(parts or [np.zeros(0, np.float32)]).astype(np.float32)

    def targets(self) -> np.ndarray:
        """[ΣT] the scored tokens, span after span."""
        return np.concatenate([self.tokens[s : s + n] for s, n in self.spans] or [np.zeros(0, self.tokens.dtype)])


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def shared_prefix(seqs: list[Scored]) -> int:
    """Tokens a row's sequences have in common at their start (none for a single sequence)."""
    return 0 if len(seqs) == 1 else min(common_prefix(seqs[0].tokens, s.tokens) for s in seqs[1:])


@dataclass
class _Row:
    tokens: np.ndarray  # [W] the prefix once, then every branch
    positions: np.ndarray  # [W] each token's position in its own sequence
    branch: np.ndarray  # [W] 0 = the shared prefix, b >= 1 = the b-th sequence's remainder
    rows: np.ndarray  # [ΣT] flat positions whose hidden state predicts each scored token


def layout_row(seqs: list[Scored]) -> _Row:
    """One row of the batch: the sequences' longest common prefix once (none for a single sequence),
    then each one's remainder. The hidden state at position j predicts token j+1, so a span
    (start, n) is predicted at positions start-1 .. start+n-2 of its sequence, in the prefix or in
    its branch."""
    shared = shared_prefix(seqs)
    tokens, positions, branch, rows = [seqs[0].tokens[:shared]], [np.arange(shared)], [np.zeros(shared, int)], []
    offset = shared
    for b, seq in enumerate(seqs, start=1):
        rest = len(seq.tokens) - shared
        tokens.append(seq.tokens[shared:])
        positions.append(np.arange(shared, len(seq.tokens)))
        branch.append(np.full(rest, b))
        for start, n in seq.spans:
            q = np.arange(start - 1, start + n - 1)
            rows.append(np.where(q < shared, q, offset + q - shared))
        offset += rest
    return _Row(np.concatenate(tokens), np.concatenate(positions), np.concatenate(branch), np.concatenate(rows))


def row_length(seqs: list[Scored]) -> int:
    """Tokens of the row the sequences make (layout_row): the shared prefix counted once."""
    shared = shared_prefix(seqs)
    return shared + sum(len(s.tokens) - shared for s in seqs)


def batch_log_softmax(model, batch: list[list[Scored]]) -> torch.Tensor:
    """log πθ(· | the tokens before) at every scored position of every row's sequences, in order
    (row, sequence, span, token): [ΣT, V], each span's logits divided by its temperature (the
    distribution its tokens were sampled from). `model` is a ResponseScorer or a plain HF LM.

    The rows run as one right-padded batch. Under causal attention a position never attends to the
    padding after it, so each row equals its own unpadded forward; a row with a shared prefix gets a
    [B, 1, L, L] mask in which a branch sees the prefix and itself, at its own sequence's positions."""
    scorer = model if isinstance(model, ResponseScorer) else ResponseScorer(model)
    device = next(scorer.parameters()).device
    laid = [layout_row(seqs) for seqs in batch]
    width = max(len(r.tokens) for r in laid)
    input_ids = torch.zeros(len(laid), width, dtype=torch.long)
    branch = torch.full((len(laid), width), -1, dtype=torch.long)  # -1: padding
    positions = torch.zeros(len(laid), width, dtype=torch.long)
    for b, r in enumerate(laid):
        input_ids[b, : len(r.tokens)] = torch.from_numpy(r.tokens.astype(np.int64))
        branch[b, : len(r.tokens)] = torch.from_numpy(r.branch)
        positions[b, : len(r.tokens)] = torch.from_numpy(r.positions)
    rows = torch.from_numpy(np.concatenate([r.rows + b * width for b, r in enumerate(laid)]))
    tempered = any(s.tempered for seqs in batch for s in seqs)
    inverse = (
        torch.from_numpy(np.concatenate([s.inverse_temperatures() for seqs in batch for s in seqs])).to(device)
        if tempered
        else None  # all at 1: the plain log-softmax
    )
    if all(len(seqs) == 1 for seqs in batch):
        return scorer(input_ids.to(device), (branch >= 0).long().to(device), rows.to(device), None, inverse)
    key, query = branch[:, None, :], branch[:, :, None]  # [B, 1, L] and [B, L, 1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    allowed = causal & (key >= 0) & ((key == 0) | (key == query))
    allowed |= torch.eye(width, dtype=torch.bool)  # a padding query sees itself (no empty softmax row)
    return scorer(input_ids.to(device), allowed[:, None].to(device), rows.to(device), positions.to(device), inverse)


def token_logprobs(log_softmax: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[N, V] log-probs, [N] tokens -> [N] log-prob of each token."""
    return log_softmax.gather(-1, tokens[:, None]).squeeze(-1)


def response_logprobs(
    model, prompt_ids: torch.Tensor, response_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log πθ(response_t | prompt, response_<t) for each response token of one sequence, at the
    temperature it was sampled at: [T]."""
    seq = Scored(
        torch.cat([prompt_ids, response_ids]).cpu().numpy(),
        [(prompt_ids.numel(), response_ids.numel())],
        [np.full(response_ids.numel(), temperature, np.float32)],
    )
    return token_logprobs(batch_log_softmax(model, [[seq]]), response_ids)
