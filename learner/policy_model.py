"""The trainable policy: a plain HF causal LM, scored only where it matters.

The vocabulary projection is applied to the response positions alone: over a ~500-token prompt
and a ≤32-token response that avoids >90% of the lm_head work and of the [L, V] logits memory.

What one forward scores (learner/step.py forms them): a batch of rows, right-padded; a row is one
or more token sequences, each with the spans (its turns' responses) to score. A row of one
sequence is a plain causal row. A row of several lays out their longest common prefix once and
then each sequence's remainder as a branch that attends to the prefix and to itself only, at the
positions it has in its own sequence: every scored row is then exactly what the sequence's own
forward gives, with the shared prefix (a group's system part and first turns) computed once.

How a branch sees the prefix (Prefix Grouper's split attention): the linear layers run on the row as
laid out, each token once; the attention runs per sequence, the prefix's queries, keys and values
joined with the branch's, with SDPA's plain causal kernel. A [L, L] mask over the whole row would
do the same but sends CPU SDPA to a kernel ~2x slower per score, over all the row's pairs; the split
computes only the pairs a sequence's own forward has (the prefix's own rows once, kept from the
first branch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SPLIT_ATTENTION = "empo2_split"  # SDPA, and split attention for the rows that share a prefix


def split_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, prefix_rows=None, **kwargs):
    """HF's SDPA attention, unless `prefix_rows` lays the batch out (batch_log_softmax): per row,
    (the shared prefix's length P, the (start, end) of each branch, the first starting at P).
    query [B, H, W, D], key / value [B, KV heads, W, D] -> [B, W, H, D]; padding gets zeros."""
    if prefix_rows is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    heads, width, dim = query.shape[1:]
    rows = []
    for b, (shared, branches) in enumerate(prefix_rows):
        parts = []
        for j, (start, end) in enumerate(branches):
            q, k, v = (
                torch.cat([x[b : b + 1, :, :shared], x[b : b + 1, :, start:end]], dim=2) for x in (query, key, value)
            )
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling)  # [1, H, P + n, D]
            parts.append(out if j == 0 else out[:, :, shared:])
        parts.append(query.new_zeros(1, heads, width - branches[-1][1], dim))
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows).transpose(1, 2).contiguous(), None


AttentionInterface.register(SPLIT_ATTENTION, split_attention)
AttentionMaskInterface.register(SPLIT_ATTENTION, sdpa_mask)


def load_policy(model_path: str, device: str | torch.device):  # the learner's resolved device
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation=SPLIT_ATTENTION)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return model.to(device), tokenizer


class ResponseScorer(torch.nn.Module):
    """The causal LM as one module whose forward applies the vocabulary projection at the given
    rows only. One forward is what FSDP needs (learner/distributed.py): the root unit (embeddings,
    norm, tied lm_head) is gathered around it."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm
        if lm.config._attn_implementation != SPLIT_ATTENTION:  # a model not loaded by load_policy
            lm.set_attn_implementation(SPLIT_ATTENTION)

    def forward(
        self,
        input_ids: torch.Tensor,
        rows: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        inverse_temperature: torch.Tensor | None = None,
        prefix_rows: list[tuple[int, list[tuple[int, int]]]] | None = None,
    ) -> torch.Tensor:
        """[B, L] right-padded ids (no mask: batch_log_softmax says why), [N] rows of the flattened
        [B*L] positions -> [N, V] log-softmax, of the logits times `inverse_temperature` [N] when
        given (each row at the temperature it was sampled at). `prefix_rows`: rows with a shared
        prefix (split_attention)."""
        hidden = self.lm.get_decoder()(
            input_ids=input_ids, position_ids=position_ids, prefix_rows=prefix_rows
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
    rows: np.ndarray  # [ΣT] flat positions whose hidden state predicts each scored token
    shared: int  # the prefix's length
    bounds: list[tuple[int, int]]  # (start, end) of each branch in the row


def layout_row(seqs: list[Scored]) -> _Row:
    """One row of the batch: the sequences' longest common prefix once (none for a single sequence),
    then each one's remainder. The hidden state at position j predicts token j+1, so a span
    (start, n) is predicted at positions start-1 .. start+n-2 of its sequence, in the prefix or in
    its branch."""
    shared = shared_prefix(seqs)
    tokens, positions, rows = [seqs[0].tokens[:shared]], [np.arange(shared)], []
    offset, bounds = shared, []
    for seq in seqs:
        rest = len(seq.tokens) - shared
        tokens.append(seq.tokens[shared:])
        positions.append(np.arange(shared, len(seq.tokens)))
        for start, n in seq.spans:
            q = np.arange(start - 1, start + n - 1)
            rows.append(np.where(q < shared, q, offset + q - shared))
        bounds.append((offset, offset + rest))
        offset += rest
    return _Row(np.concatenate(tokens), np.concatenate(positions), np.concatenate(rows), shared, bounds)


def row_length(seqs: list[Scored]) -> int:
    """Tokens of the row the sequences make (layout_row): the shared prefix counted once."""
    shared = shared_prefix(seqs)
    return shared + sum(len(s.tokens) - shared for s in seqs)


def batch_log_softmax(model, batch: list[list[Scored]]) -> torch.Tensor:
    """log πθ(· | the tokens before) at every scored position of every row's sequences, in order
    (row, sequence, span, token): [ΣT, V], each span's logits divided by its temperature (the
    distribution its tokens were sampled from). `model` is a ResponseScorer or a plain HF LM.

    The rows run as one right-padded batch with no padding mask: under causal attention a position
    never attends to the padding after it, so each row equals its own unpadded forward, and SDPA
    keeps its causal kernel. A padding mask would send CPU SDPA to its masked kernel, which keeps a
    [rows, heads, L, L] attention matrix per layer for the backward (three ~1.3k-token rows: 1-1.5 GB
    more, 25% slower, the same log-probs). In a batch with a shared-prefix row, a branch sees the
    prefix and itself, at its own sequence's positions (split_attention)."""
    scorer = model if isinstance(model, ResponseScorer) else ResponseScorer(model)
    device = next(scorer.parameters()).device
    laid = [layout_row(seqs) for seqs in batch]
    width = max(len(r.tokens) for r in laid)
    input_ids = torch.zeros(len(laid), width, dtype=torch.long)
    positions = torch.zeros(len(laid), width, dtype=torch.long)
    for b, r in enumerate(laid):
        input_ids[b, : len(r.tokens)] = torch.from_numpy(r.tokens.astype(np.int64))
        positions[b, : len(r.tokens)] = torch.from_numpy(r.positions)
    rows = torch.from_numpy(np.concatenate([r.rows + b * width for b, r in enumerate(laid)]))
    tempered = any(s.tempered for seqs in batch for s in seqs)
    inverse = (
        torch.from_numpy(np.concatenate([s.inverse_temperatures() for seqs in batch for s in seqs])).to(device)
        if tempered
        else None  # all at 1: the plain log-softmax
    )
    if all(len(seqs) == 1 for seqs in batch):
        return scorer(input_ids.to(device), rows.to(device), None, inverse)
    prefix_rows = [(r.shared, r.bounds) for r in laid]
    return scorer(input_ids.to(device), rows.to(device), positions.to(device), inverse, prefix_rows)


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
