"""Runs inside each vLLM worker process (passed as `worker_extension_cls`).

Kept free of vLLM imports so the worker can import it cheaply; `self.model_runner` is provided
by the vLLM worker this class is mixed into.
"""

from __future__ import annotations

import os


def _cap_shm_busy_loop() -> None:
    """Bound how long this worker spins on vLLM's shared-memory queue after each read.

    vLLM's reader busy-loops (sched_yield) for 1 s after every message so it can pick up the
    next scheduler step without a socket wake-up. With requests arriving every second that is
    a whole core spinning, which on a small CPU host starves the learner and the environments
    (measured: 11.9 CPU-s in 8.8 s for 80 generated tokens). The policy engine sets
    EMPO2_VLLM_BUSY_LOOP_S (0 on CPU); unset, vLLM's behaviour is unchanged (GPU hosts).
    """
    cap = os.environ.get("EMPO2_VLLM_BUSY_LOOP_S")
    if cap is None:
        return
    from vllm.distributed.device_communicators import shm_broadcast

    original_wait = shm_broadcast.SpinCondition.wait

    def wait(self, timeout_ms=None):
        self.busy_loop_s = min(self.busy_loop_s, float(cap))
        return original_wait(self, timeout_ms)

    shm_broadcast.SpinCondition.wait = wait


_cap_shm_busy_loop()  # runs when the vLLM worker imports this extension


class WeightUpdateExtension:
    def load_weights_from_file(self, path: str, lora_base_dir: str = "", lora_scale: float = 0.0) -> int:
        """Load a safetensors file of HF-named tensors into the running model, in place; with
        lora_scale > 0 the file is a LoRA adapter, merged onto the base model in `lora_base_dir`.

        `reload_weights(..., is_checkpoint_format=True)` applies the model's own checkpoint
        loader, including the CPU backend's repacking of linear weights that a plain
        `model.load_weights` misses (platform.md). Returns the number of tensors applied.
        """
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            weights = [(name, f.get_tensor(name)) for name in f.keys()]
        if lora_scale > 0:
            from actors.weight_receiver import merged_lora_weights

            weights = merged_lora_weights(lora_base_dir, dict(weights), lora_scale)
        self.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        self._retie_lm_head()
        return len(weights)

    def _retie_lm_head(self) -> None:
        """Re-tie a tied lm_head to the freshly loaded embedding.

        vLLM's loader skips `lm_head.*` for tied models, and the layer-wise reload puts the
        lm_head's *old* kernel tensors back, so without this the output projection keeps the
        initial weights (the policy-server integration test catches it: 0.86 nats of log-prob
        mismatch after one update). Re-running the layer's post-load processing redoes the CPU
        backend's GEMM dispatch/packing for the new tensor; on GPU it is a no-op.
        """
        model = self.model_runner.get_model()
        config = getattr(model, "config", None)
        if not (getattr(config, "tie_word_embeddings", False) and hasattr(model, "lm_head")):
            return
        model.lm_head.weight = model.model.embed_tokens.weight  # vLLM decoder-only layout
        model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
