"""A base model's fingerprint: one hash of its architecture config and every weight tensor.

Components record it and the loader refuses a mismatch, so prompt tokens trained for one base model
are never used with another. It is computed from the saved safetensors (not from a loaded model),
so the fp32 and the 4-bit loading of one checkpoint share a fingerprint.
"""

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open

# Keys that describe how a file was written, not what the model computes.
_VOLATILE_CONFIG_KEYS = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures",
                         "quantization_config", "use_cache", "output_attentions", "output_hidden_states"}
CACHE_FILE = "ppdkit-fingerprint.json"


def compute_fingerprint(model_dir: Path) -> str:
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    arch = {k: v for k, v in sorted(config.items()) if k not in _VOLATILE_CONFIG_KEYS}
    digest = hashlib.sha256(json.dumps(arch, sort_keys=True).encode())
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors weights to fingerprint")
    tensors: dict[str, tuple[Path, str]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                tensors[name] = (file, name)
    for name in sorted(tensors):
        file, key = tensors[name]
        with safe_open(str(file), framework="pt") as f:
            t = f.get_tensor(key).contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return "sha256:" + digest.hexdigest()


def cached_fingerprint(model_dir: Path) -> str:
    """The fingerprint, cached beside the weights and recomputed when any weight file changes."""
    model_dir = Path(model_dir)
    stamp = {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(model_dir.glob("*.safetensors"))}
    stamp["config.json"] = [(model_dir / "config.json").stat().st_mtime_ns]
    cache = model_dir / CACHE_FILE
    if cache.is_file():
        saved = json.loads(cache.read_text())
        if saved.get("stamp") == stamp:
            return saved["fingerprint"]
    fingerprint = compute_fingerprint(model_dir)
    try:
        cache.write_text(json.dumps({"fingerprint": fingerprint, "stamp": stamp}))
    except OSError:
        pass  # a read-only model directory still gets its fingerprint, just not cached
    return fingerprint
