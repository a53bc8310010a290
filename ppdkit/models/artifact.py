"""The component artifact: the one contract between the trainer (writer) and the decoder (reader).

A directory holding `component.json` (format version, method, hyperparameters, base model name and
fingerprint, the run that made it, and every other file with its sha256 and size),
`weights.safetensors`, and method extras (PPD: `trees.json`, and optionally `ngrams.safetensors`, the
corpus n-gram table of models/ngram_table.py).

Loading checks every required key, every listed file's size and sha256 (each file is read once, hashed,
then parsed from the same bytes, so what was checked is what is used), refuses non-finite weights, and
refuses a component made for another base model. A damaged or tampered download is never used.
Files in the directory that component.json does not list are not read.
"""

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from ppdkit.models.paths import shown

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
REQUIRED = ("format_version", "method", "hyperparameters", "base_model", "run")
REQUIRED_BASE = ("name", "fingerprint")
META_FILE = "component.json"
WEIGHTS_FILE = "weights.safetensors"
NGRAMS_FILE = "ngrams.safetensors"
COMMITTED_COMPONENTS = Path(__file__).parent / "components"  # the components committed with ppdkit
FIX = "export the component again (or download it again from the registry)"


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
    extras: dict[str, Any]  # the other JSON files of the component, by stem (e.g. "trees")
    ngrams: dict[str, torch.Tensor] | None = None  # ngrams.safetensors, when the component has one
    verified: bool = True  # False for a component written before files carried checksums


def write_component(directory: Path, method: str, hyperparameters: dict, base_name: str, fingerprint: str,
                    run: dict, tensors: dict[str, torch.Tensor], extras: dict[str, Any] | None = None) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(directory / WEIGHTS_FILE))
    meta = {"format_version": FORMAT_VERSION, "method": method, "hyperparameters": hyperparameters,
            "base_model": {"name": base_name, "fingerprint": fingerprint}, "run": run,
            "weights": sorted(tensors), "files": {}}
    _write_meta(directory, meta)
    add_files(directory, json_files=extras or {}, listed=[WEIGHTS_FILE])
    return directory


def add_files(directory: Path, json_files: dict[str, Any] | None = None,
              tensor_files: dict[str, dict[str, torch.Tensor]] | None = None, listed: list[str] = ()) -> None:
    """Write method extras into a component (JSON by stem, safetensors by file name) and list them, with
    `listed` files already written, in its component.json with their sha256 and size."""
    directory = Path(directory)
    meta = _read_meta(directory)
    names = list(listed)
    for stem, value in (json_files or {}).items():
        (directory / f"{stem}.json").write_text(json.dumps(value, indent=2))
        names.append(f"{stem}.json")
    for name, tensors in (tensor_files or {}).items():
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(directory / name))
        names.append(name)
    files = meta.get("files")
    if files is None:  # a component from before checksums: list what it holds now
        files = {name: {} for name in _unlisted_names(directory)}
    for name in {*files, *names}:
        data = (directory / name).read_bytes()
        files[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    meta["files"] = dict(sorted(files.items()))
    _write_meta(directory, meta)


def write_ngrams(directory: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """Add a corpus n-gram table (NgramTable.to_tensors()) to a component directory."""
    add_files(directory, tensor_files={NGRAMS_FILE: tensors})
    return Path(directory) / NGRAMS_FILE


def read_component(directory: Path, expect_fingerprint: str | None = None) -> Component:
    directory = Path(directory)
    meta = _read_meta(directory)
    meta_path = directory / META_FILE
    missing = [k for k in REQUIRED if k not in meta] + [f"base_model.{k}" for k in REQUIRED_BASE
                                                         if k not in meta.get("base_model", {})]
    if missing:
        raise ArtifactError(f"{meta_path} lacks {', '.join(missing)}: {FIX}")
    if meta["format_version"] != FORMAT_VERSION:
        raise ArtifactError(f"{meta_path} has format {meta['format_version']}; this ppdkit reads {FORMAT_VERSION}")
    if expect_fingerprint is not None and meta["base_model"]["fingerprint"] != expect_fingerprint:
        raise ArtifactError(
            f"component {directory} was trained for base model {meta['base_model']['name']} "
            f"({meta['base_model']['fingerprint'][:19]}), not for the model loaded ({expect_fingerprint[:19]}): "
            "train one for this model, or load the base model it names")
    listing = meta.get("files")
    if listing is None:
        log.warning("%s lists no checksums (written by an older ppdkit), so it is loaded unverified; "
                    "export it again to have its files checked", meta_path)
        contents = {name: (directory / name).read_bytes() for name in _unlisted_names(directory)}
    else:
        if WEIGHTS_FILE not in listing:
            raise ArtifactError(f"{meta_path} does not list {WEIGHTS_FILE}: {FIX}")
        contents = {name: _verified_bytes(directory, name, entry) for name, entry in listing.items()}
    if WEIGHTS_FILE not in contents:
        raise ArtifactError(f"{directory} has no {WEIGHTS_FILE}: {FIX}")
    tensors = _tensors(directory / WEIGHTS_FILE, contents[WEIGHTS_FILE])
    if sorted(tensors) != sorted(meta.get("weights", tensors)):
        raise ArtifactError(f"{directory}/{WEIGHTS_FILE} does not hold the tensors component.json lists")
    extras = {}
    for name, data in contents.items():
        if name.endswith(".json"):
            try:
                extras[name.removesuffix(".json")] = json.loads(data)
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ArtifactError(f"{directory}/{name} is not valid JSON ({e}): {FIX}") from None
    ngrams = _tensors(directory / NGRAMS_FILE, contents[NGRAMS_FILE]) if NGRAMS_FILE in contents else None
    return Component(directory, meta["method"], meta["hyperparameters"], meta["base_model"], meta["run"],
                     tensors, extras, ngrams, verified=listing is not None)


def committed_named_as(directory: Path) -> str:
    """A hint for a path that is not a component: the committed component of the same folder name, if there is one
    (the committed components moved from models/components to ppdkit/models/components; old commands name the first)."""
    committed = COMMITTED_COMPONENTS / Path(directory).name
    if (committed / META_FILE).is_file():
        return f"; the committed component of that name is {shown(committed)}"
    return ""


def _read_meta(directory: Path) -> dict:
    path = directory / META_FILE
    if not path.is_file():
        raise ArtifactError(f"{directory} is not a ppdkit component (no {META_FILE}){committed_named_as(directory)}")
    try:
        meta = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{path} is not valid JSON ({e}): {FIX}") from None
    if not isinstance(meta, dict):
        raise ArtifactError(f"{path} must hold a JSON object: {FIX}")
    return meta


def _write_meta(directory: Path, meta: dict) -> None:
    tmp = directory / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    os.replace(tmp, directory / META_FILE)  # readers see the old listing or the new one, never half


def _unlisted_names(directory: Path) -> list[str]:
    """The files an old component (no checksums) was read from: its weights, JSON extras, n-gram table."""
    names = [p.name for p in sorted(directory.glob("*.json")) if p.name != META_FILE]
    return [WEIGHTS_FILE] * (directory / WEIGHTS_FILE).is_file() + names + [NGRAMS_FILE] * (directory / NGRAMS_FILE).is_file()


def _verified_bytes(directory: Path, name: str, entry: Any) -> bytes:
    if "/" in name or "\\" in name or name.startswith(".") or name == META_FILE:
        raise ArtifactError(f"{directory}/{META_FILE} lists {name!r}, which is not a file of the component: {FIX}")
    path = directory / name
    if not path.is_file():
        raise ArtifactError(f"{path} is missing (component.json lists it): {FIX}")
    data = path.read_bytes()
    want_size, want_sha = (entry.get("size"), entry.get("sha256")) if isinstance(entry, dict) else (None, None)
    if len(data) != want_size:
        raise ArtifactError(f"{path} has {len(data)} bytes, component.json lists {want_size}: the file is damaged "
                            f"or incomplete; {FIX}")
    got = hashlib.sha256(data).hexdigest()
    if got != want_sha:
        raise ArtifactError(f"{path} does not match its sha256 in component.json ({got[:16]}... != "
                            f"{str(want_sha)[:16]}...): the file is damaged or was changed after export; {FIX}")
    return data


def _tensors(path: Path, data: bytes) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file's bytes; a floating tensor holding NaN or inf is refused."""
    try:
        tensors = load_safetensors(data)
    except Exception as e:  # safetensors raises its own error types for a bad header or truncated data
        raise ArtifactError(f"{path} is not a readable safetensors file ({e}): {FIX}") from None
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ArtifactError(f"{path}: tensor {name!r} holds {bad} non-finite value(s) (NaN or inf) of "
                                f"{tensor.numel()}: a component with such weights is never used; {FIX}")
    return tensors
