"""The trainable policy: a plain HF causal LM, scored only where it matters.

The vocabulary projection is applied to the response positions alone: over a ~500-token prompt
and a ≤32-token response that avoids >90% of the lm_head work and of the [L, V] logits memory.
"""

from __future__ import annotations

import torch


def load_policy(model_path: str, device: str = "cpu"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return model, tokenizer


def response_log_softmax(model, prompt_ids: torch.Tensor, response_ids: torch.Tensor) -> torch.Tensor:
    """log πθ(· | prompt, response_<t) over the vocabulary at each response position: [T, V]."""
    prompt_len = prompt_ids.numel()
    input_ids = torch.cat([prompt_ids, response_ids])[None]
    hidden = model.get_decoder()(input_ids=input_ids).last_hidden_state[0]  # [P+T, H]
    # the hidden state at position j predicts token j+1: positions P-1 .. P+T-2 predict the response
    logits = model.get_output_embeddings()(hidden[prompt_len - 1 : -1]).float()  # [T, V]
    return torch.log_softmax(logits, dim=-1)


def response_logprobs(model, prompt_ids: torch.Tensor, response_ids: torch.Tensor) -> torch.Tensor:
    """log πθ(response_t | prompt, response_<t) for each response token: [T]."""
    return response_log_softmax(model, prompt_ids, response_ids).gather(-1, response_ids[:, None]).squeeze(-1)
