"""Runs inside each vLLM worker process (passed as `worker_extension_cls`).

Kept free of vLLM imports so the worker can import it cheaply; `self.model_runner` is provided
by the vLLM worker this class is mixed into.
"""

from __future__ import annotations


class WeightUpdateExtension:
    def load_weights_from_file(self, path: str) -> int:
        """Load a safetensors file of HF-named tensors into the running model, in place.

        `reload_weights(..., is_checkpoint_format=True)` applies the model's own checkpoint
        loader, including the CPU backend's repacking of linear weights that a plain
        `model.load_weights` misses (platform.md). Returns the number of tensors applied.
        """
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            weights = [(name, f.get_tensor(name)) for name in f.keys()]
        self.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        return len(weights)
