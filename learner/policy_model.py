"""The trainable policy: a plain HF causal LM, scored only where it matters.

The vocabulary projection is applied to the response positions alone: over a ~500-token prompt
and a ≤32-token response that avoids >90% of the lm_head work and of the [L, V] logits memory.
Several (prompt, response) sequences are scored as one right-padded batch (learner/train.py
forms the micro-batches).
"""

from __future__ import annotations

import torch


def load_policy(model_path: str, device: str | torch.device):  # the learner's resolved device
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return model, tokenizer


class ResponseScorer(torch.nn.Module):
    """The causal LM as one module whose forward applies the vocabulary projection at the given
    rows only. One forward is what FSDP needs (learner/distributed.py): the root unit (embeddings,
    norm, tied lm_head) is gathered around it."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """[B, L] ids and mask, [N] rows of the flattened [B*L] positions -> [N, V] log-softmax."""
        hidden = self.lm.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state  # [B, L, H]
        logits = self.lm.get_output_embeddings()(hidden.flatten(0, 1)[rows]).float()  # [N, V]
        return torch.log_softmax(logits, dim=-1)


def batch_log_softmax(model, prompts: list[torch.Tensor], responses: list[torch.Tensor]) -> torch.Tensor:
    """log πθ(· | prompt_b, response_b,<t) over the vocabulary at every response position of every
    sequence b, concatenated in order: [ΣT_b, V]. `model` is a ResponseScorer or a plain HF LM.

    The sequences run as one right-padded batch. Under causal attention a position never attends
    to the padding after it, so each sequence's rows equal its own unpadded forward.
    """
    scorer = model if isinstance(model, ResponseScorer) else ResponseScorer(model)
    lengths = [p.numel() + r.numel() for p, r in zip(prompts, responses)]
    width = max(lengths)
    input_ids = prompts[0].new_zeros(len(prompts), width)  # [B, L]
    attention_mask = torch.zeros_like(input_ids)
    rows = []
    for b, (prompt, response) in enumerate(zip(prompts, responses)):
        input_ids[b, : lengths[b]] = torch.cat([prompt, response])
        attention_mask[b, : lengths[b]] = 1
        # the hidden state at position j predicts token j+1: positions P-1 .. P+T-2 predict the response
        rows.append(torch.arange(prompt.numel() - 1, lengths[b] - 1, device=input_ids.device) + b * width)
    return scorer(input_ids, attention_mask, torch.cat(rows))


def token_logprobs(log_softmax: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[N, V] log-probs, [N] tokens -> [N] log-prob of each token."""
    return log_softmax.gather(-1, tokens[:, None]).squeeze(-1)


def response_logprobs(model, prompt_ids: torch.Tensor, response_ids: torch.Tensor) -> torch.Tensor:
    """log πθ(response_t | prompt, response_<t) for each response token of one sequence: [T]."""
    return token_logprobs(batch_log_softmax(model, [prompt_ids], [response_ids]), response_ids)
