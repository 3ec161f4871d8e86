"""Runs inside each vLLM worker process (passed as `worker_extension_cls`).

Kept free of vLLM imports so the worker can import it cheaply; `self.model_runner` is provided
by the vLLM worker this class is mixed into.
"""

from __future__ import annotations

import os

IDLE_RECHECK_MS = 20  # the longest a capped reader sleeps before looking at the queue again


def cap_shm_busy_loop() -> None:
    """Bound how long a vLLM process spins on vLLM's shared-memory queue after each read.

    vLLM's reader busy-loops (sched_yield) for 1 s after every message so it can pick up the
    next scheduler step without a socket wake-up. With requests arriving every second that is
    a whole core spinning, which on a small CPU host starves the learner and the environments
    (measured: 11.9 CPU-s in 8.8 s for 80 generated tokens in a worker; the engine-core process,
    which reads the workers' outputs, spun 0.37 of a core beside 4 env actors). The policy engine
    sets EMPO2_VLLM_BUSY_LOOP_S (0 on CPU); unset, vLLM's behaviour is unchanged (GPU hosts).
    Runs in every vLLM process: as a vLLM general plugin (pyproject.toml entry point, loaded by
    the engine core and the workers) and when a worker imports this extension.

    Going idle sooner means relying on the writer's zmq notification, and that can be missed: the
    writer's PUB socket keeps one message (SNDHWM 1) and the reader's SUB socket keeps the last
    (CONFLATE), so a stale notification consumed after a spin read leaves the next write unsignalled
    and the reader sleeps vLLM's whole recheck interval (SHM_READER_RECHECK_INTERVAL_MS, 5 s), as
    generations taking exactly 5 s longer showed (benchmarks/prompt_cost.py). So an idle wait is also capped, at IDLE_RECHECK_MS: a missed notification then costs
    at most that, and the extra wake-ups (a poll and a flag check) cost nothing measurable.
    """
    cap = os.environ.get("EMPO2_VLLM_BUSY_LOOP_S")
    if cap is None:
        return
    from vllm.distributed.device_communicators import shm_broadcast

    if getattr(shm_broadcast.SpinCondition.wait, "empo2_capped", False):
        return
    original_wait = shm_broadcast.SpinCondition.wait

    def wait(self, timeout_ms=None):
        self.busy_loop_s = min(self.busy_loop_s, float(cap))
        return original_wait(self, IDLE_RECHECK_MS if timeout_ms is None else min(timeout_ms, IDLE_RECHECK_MS))

    wait.empo2_capped = True
    shm_broadcast.SpinCondition.wait = wait


def exit_like_a_forked_child() -> None:
    """In a process that vLLM started (engine core, worker: multiprocessing's spawn), end it as
    multiprocessing ends a forked child: once the process's target has returned and
    multiprocessing's finalizers have run (they unlink and unregister its semaphores and shared
    memory), the atexit handlers run and the process exits with its exit status, without the
    interpreter's finalization: its last collections of the whole heap (torch, transformers, vLLM)
    free only what the exit frees anyway, and on a busy 2-core host they made the worker, then the
    engine core, overrun vLLM's stop timeout: the core was killed mid-teardown and the resource
    tracker it shares with the policy server reported a leaked semaphore (issue 39). A process that
    exits another way (an exception at its top level) is left as it is."""
    import multiprocessing
    import sys

    if multiprocessing.parent_process() is None or getattr(sys.exit, "empo2_fork_like", False):
        return
    plain_exit = sys.exit

    def exit(status=None):
        caller = sys._getframe(1).f_code
        if caller.co_name != "spawn_main" or not caller.co_filename.endswith("multiprocessing/spawn.py"):
            plain_exit(status)
        import atexit

        if status is None:
            code = 0
        elif isinstance(status, int):
            code = status
        else:
            print(status, file=sys.stderr)
            code = 1
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

    exit.empo2_fork_like = True
    sys.exit = exit


cap_shm_busy_loop()  # runs when the vLLM worker imports this extension
exit_like_a_forked_child()  # and in every vLLM process that loads it as a plugin (imports this module)


class WeightUpdateExtension:
    def load_weights_from_file(self, path: str, lora_base_dir: str = "", lora_scale: float = 0.0) -> int:
        """Load a safetensors file of HF-named tensors into the running model, in place, straight
        from a mapping of it; with lora_scale > 0 the file is a LoRA adapter, merged onto the base
        model in `lora_base_dir`. Returns the number of tensors applied.

        The CPU backend takes `load_packed_cpu` (0.1-0.2 s for the 135M model); anything it does not
        cover takes `reload_weights(..., is_checkpoint_format=True)`, the model's own checkpoint
        loader, which also redoes the CPU backend's repacking of linear weights that a plain
        `model.load_weights` misses (platform.md) but re-materialises every layer (0.3-0.7 s).
        """
        from protocol.weight_file import mapped_weights

        with mapped_weights(path) as weights:
            if lora_scale > 0:
                from actors.policy_server.weight_receiver import merged_lora_weights

                weights = merged_lora_weights(lora_base_dir, dict(weights), lora_scale)
            model = self.model_runner.get_model()
            if not load_packed_cpu(model, weights):
                self.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
                _retie_lm_head(model)
            return len(weights)


def load_packed_cpu(model, weights: list) -> bool:
    """vLLM's CPU backend: copy the new tensors into the model's parameters and repack each linear
    layer from its new weight, skipping the generic loader's re-materialisation of every layer.

    A linear layer on CPU keeps no weight of its own: vLLM packs it for oneDNN after loading and
    drops the parameter. So its new weight (for fused layers, e.g. qkv_proj from q/k/v_proj as
    listed in the model's `packed_modules_mapping`, a view of the mapping when the file holds the
    parts back to back) is set and the layer's own post-load step packs it again, exactly as at
    start-up. Returns False, having changed nothing, unless this is the CPU backend and every
    parameter finds its tensor(s) with the right shape and every tensor is used: other models and
    devices take the generic path.
    """
    import torch
    from vllm.platforms import current_platform

    from protocol.weight_file import concat_rows

    if not current_platform.is_cpu():
        return False
    sources = dict(weights)
    fused = getattr(model, "packed_modules_mapping", {}) or {}
    copies, packs, used, seen = [], [], set(), set()
    for module_name, module in model.named_modules():
        parent, _, leaf = module_name.rpartition(".")
        if hasattr(module, "cpu_linear") and not type(getattr(module, "quant_method", None)).__name__.startswith(
            "Unquantized"
        ):
            return False  # quantized kernels pack differently
        weight = getattr(module, "weight", None)
        packed = hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.numel() == 0
        for param_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:  # a tied parameter (lm_head = embed_tokens) is loaded once
                continue
            seen.add(id(param))
            parts = [f"{parent}.{p}.{param_name}".lstrip(".") for p in fused.get(leaf, ())] or [
                f"{module_name}.{param_name}"
            ]
            if not all(p in sources for p in parts):
                return False
            used.update(parts)
            tensor = concat_rows([sources[p] for p in parts]) if len(parts) > 1 else sources[parts[0]]
            if packed and param_name == "weight":
                shape = (module.output_size_per_partition, module.input_size_per_partition)
                if tuple(tensor.shape) != shape:
                    return False
                packs.append((module, tensor.to(param.dtype)))
            elif tensor.shape != param.shape:
                return False
            else:
                copies.append((param, tensor))
    if used != set(sources):
        return False
    with torch.no_grad():
        for param, tensor in copies:
            param.copy_(tensor)
        for module, weight in packs:
            module.weight = torch.nn.Parameter(weight, requires_grad=False)
        for module in model.modules():  # every layer with a CPU GEMM handler packs its new weight
            if hasattr(module, "cpu_linear") and hasattr(module, "quant_method"):
                module.quant_method.process_weights_after_loading(module)
    return True


def _retie_lm_head(model) -> None:
    """Re-tie a tied lm_head to the freshly loaded embedding (after `reload_weights`).

    vLLM's loader skips `lm_head.*` for tied models, and the layer-wise reload puts the
    lm_head's *old* kernel tensors back, so without this the output projection keeps the
    initial weights (the policy-server integration test catches it: 0.86 nats of log-prob
    mismatch after one update). Re-running the layer's post-load processing redoes the CPU
    backend's GEMM dispatch/packing for the new tensor; on GPU it is a no-op.
    """
    config = getattr(model, "config", None)
    if not (getattr(config, "tie_word_embeddings", False) and hasattr(model, "lm_head")):
        return
    model.lm_head.weight = model.model.embed_tokens.weight  # vLLM decoder-only layout
    model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
