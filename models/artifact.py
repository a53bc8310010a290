"""The component artifact: the one contract between the trainer (writer) and the decoder (reader).

A directory holding `component.json` (format version, method, hyperparameters, base model name and
fingerprint, the run that made it), `weights.safetensors`, and method extras (PPD: `trees.json`, and
optionally `ngrams.safetensors`, the corpus n-gram table of models/ngram_table.py).
Loading checks every required key and refuses a component made for another base model.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

FORMAT_VERSION = 1
REQUIRED = ("format_version", "method", "hyperparameters", "base_model", "run")
REQUIRED_BASE = ("name", "fingerprint")
NGRAMS_FILE = "ngrams.safetensors"


class ArtifactError(ValueError):
    pass


@dataclass
class Component:
    path: Path
    method: str
    hyperparameters: dict[str, Any]
    base_model: dict[str, Any]
    run: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    extras: dict[str, Any]  # other JSON files of the directory, by stem (e.g. "trees")
    ngrams: dict[str, torch.Tensor] | None = None  # ngrams.safetensors, when the component has one


def write_component(directory: Path, method: str, hyperparameters: dict, base_name: str, fingerprint: str,
                    run: dict, tensors: dict[str, torch.Tensor], extras: dict[str, Any] | None = None) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(directory / "weights.safetensors"))
    for stem, value in (extras or {}).items():
        (directory / f"{stem}.json").write_text(json.dumps(value, indent=2))
    meta = {"format_version": FORMAT_VERSION, "method": method, "hyperparameters": hyperparameters,
            "base_model": {"name": base_name, "fingerprint": fingerprint}, "run": run,
            "weights": sorted(tensors)}
    (directory / "component.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    return directory


def write_ngrams(directory: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """Add a corpus n-gram table (NgramTable.to_tensors()) to a component directory."""
    path = Path(directory) / NGRAMS_FILE
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def read_component(directory: Path, expect_fingerprint: str | None = None) -> Component:
    directory = Path(directory)
    meta_path = directory / "component.json"
    if not meta_path.is_file():
        raise ArtifactError(f"{directory} is not a ppdkit component (no component.json)")
    meta = json.loads(meta_path.read_text())
    missing = [k for k in REQUIRED if k not in meta] + [f"base_model.{k}" for k in REQUIRED_BASE
                                                         if k not in meta.get("base_model", {})]
    if missing:
        raise ArtifactError(f"{meta_path} lacks {', '.join(missing)}")
    if meta["format_version"] != FORMAT_VERSION:
        raise ArtifactError(f"{meta_path} has format {meta['format_version']}; this ppdkit reads {FORMAT_VERSION}")
    if expect_fingerprint is not None and meta["base_model"]["fingerprint"] != expect_fingerprint:
        raise ArtifactError(
            f"component {directory} was trained for base model {meta['base_model']['name']} "
            f"({meta['base_model']['fingerprint'][:19]}), not for the model loaded ({expect_fingerprint[:19]}): "
            "train one for this model, or load the base model it names")
    tensors = load_file(str(directory / "weights.safetensors"))
    if sorted(tensors) != sorted(meta.get("weights", tensors)):
        raise ArtifactError(f"{directory}/weights.safetensors does not hold the tensors component.json lists")
    extras = {p.stem: json.loads(p.read_text()) for p in directory.glob("*.json") if p.name != "component.json"}
    ngrams = load_file(str(directory / NGRAMS_FILE)) if (directory / NGRAMS_FILE).is_file() else None
    return Component(directory, meta["method"], meta["hyperparameters"], meta["base_model"], meta["run"],
                     tensors, extras, ngrams)
