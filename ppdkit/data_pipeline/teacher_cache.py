"""The compressed teacher cache: per-position top-k log-probabilities plus the mass outside them.

A full-vocabulary fp16 distribution costs 2*V bytes per position (98 KB for SmolLM2); the top-k form
costs about k*(2+2) + 4 bytes. One shard file (safetensors) holds a run of sequences:

    row              [S]       int64    the sequence's row in the data split
    token_offsets    [S+1]     int64    sequence s is input_ids[token_offsets[s]:token_offsets[s+1]]
    input_ids        [N]       int32    the token ids the teacher saw (regenerated ones, if any)
    position_offsets [S+1]     int64    sequence s owns entries position_offsets[s]:position_offsets[s+1]
    positions        [P]       int32    position t in its sequence: the entry is the distribution there,
                                        i.e. of token t+1 (only where token t+1 is the assistant's)
    topk_ids         [P, k]    uint16 (int32 when V > 65536)
    topk_logprobs    [P, k]    float16 | bfloat16 | float32, sorted descending
    rest_mass        [P]       float32  probability mass outside the top-k

`teacher/manifest.json` lists the shards with their row counts and sha256, and the cache's figures.

With `teacher.features: true` each shard has a companion `<shard>.features.safetensors`, checksummed in the
manifest too: `features [N, H] float16`, the teacher's final hidden states (after the final norm, what the LM
head reads) at every token of input_ids, in the same order (token_offsets index both). Draft heads train on
them (trainer/features.py) instead of running the base model again over millions of positions.
"""

import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ppdkit.models.paths import file_sha256
from ppdkit.runtime.forward.dtypes import BLOCK_FORMATS

FORMAT = "ppdkit-teacher/1"
FEATURES_SUFFIX = ".features.safetensors"
STORAGE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def compress_logits(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [P, V] -> (topk_ids [P, k], topk_logprobs [P, k] float32, rest_mass [P] float32)."""
    logits = logits.float()
    top = logits.topk(min(k, logits.shape[-1]), dim=-1)  # sorted, descending
    top_logp = top.values - torch.logsumexp(logits, dim=-1, keepdim=True)  # [P, k]
    # The rest's mass in float64: 1 - sum(top) cancels badly in float32 when the top keeps nearly all.
    rest = (1.0 - top_logp.double().exp().sum(-1)).clamp_min(0.0).float()  # [P]
    return top.indices, top_logp, rest


# The runtime's LM head and its compression run this many positions at a time: a [16, V] block of logits stays in
# cache while it is read back, where the whole product would be written out to memory and read again.
# transformers' head is not cut up: MKL's float32 product runs best on all the rows at once (docs/history.md).
HEAD_ROWS = 16


def compress_head(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, k: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """compress_logits(head(hidden), k) for final hidden states [P, H] (P >= 1), HEAD_ROWS rows at a time."""
    parts = [compress_logits(head(hidden[i:i + HEAD_ROWS]), k) for i in range(0, hidden.shape[0], HEAD_ROWS)]
    ids, logprobs, rest = (torch.cat(part) for part in zip(*parts, strict=True))
    return ids, logprobs, rest


def reconstruct_logprobs(topk_ids: torch.Tensor, topk_logprobs: torch.Tensor, rest_mass: torch.Tensor,
                         vocab_size: int) -> torch.Tensor:
    """The full [P, V] log-distribution implied by the compressed form: the rest spread evenly."""
    k = topk_ids.shape[-1]
    per_other = (rest_mass.float().clamp_min(1e-30) / max(vocab_size - k, 1)).log()  # [P]
    out = per_other[:, None].expand(-1, vocab_size).clone()  # [P, V]
    return out.scatter_(-1, topk_ids.long(), topk_logprobs.float())


def id_dtype(vocab_size: int) -> torch.dtype:
    return torch.uint16 if vocab_size <= 65536 else torch.int32


@dataclass
class ShardSequence:
    row: int
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [P] int64
    # read from a cache: memory-mapped, in the dtypes stored (uint16 or int32 ids, float16 log-probs): a batch converts
    # the entries it takes, so millions of positions never sit in a worker's memory as int64 and float32
    topk_ids: torch.Tensor  # [P, k] integer
    topk_logprobs: torch.Tensor  # [P, k] floating
    rest_mass: torch.Tensor  # [P] float32
    features: torch.Tensor | None = None  # [T, H] float16: final hidden states, when the cache keeps them


def write_shard(path: Path, sequences: list[ShardSequence], vocab_size: int, dtype: str,
                features: bool = False) -> dict:
    """Write atomically (temporary file, then rename); returns the shard's record for the manifest. `features`:
    the sequences' hidden states go to the companion file (an empty one for a shard whose rows were all skipped)."""
    def cat(parts, dtype, empty_shape):
        return torch.cat(parts).to(dtype) if parts else torch.zeros(empty_shape, dtype=dtype)

    k = sequences[0].topk_ids.shape[-1] if sequences else 0
    tensors = {
        "row": torch.tensor([s.row for s in sequences], dtype=torch.int64),
        "token_offsets": _offsets([len(s.input_ids) for s in sequences]),
        "input_ids": cat([s.input_ids for s in sequences], torch.int32, (0,)),
        "position_offsets": _offsets([len(s.positions) for s in sequences]),
        "positions": cat([s.positions for s in sequences], torch.int32, (0,)),
        "topk_ids": cat([s.topk_ids for s in sequences], id_dtype(vocab_size), (0, k)),
        "topk_logprobs": cat([s.topk_logprobs for s in sequences], STORAGE_DTYPES[dtype], (0, k)),
        "rest_mass": cat([s.rest_mass for s in sequences], torch.float32, (0,)),
    }
    record = {"file": path.name, "sequences": len(sequences), "positions": int(tensors["positions"].numel()),
              "tokens": int(tensors["input_ids"].numel())}
    if features:  # first, so a shard never stands without its features
        companion = features_path(path)
        record["features"] = {"file": companion.name, **_save_atomic(
            {"features": cat([s.features for s in sequences], torch.float16, (0, 0))}, companion)}
    return {**record, **_save_atomic(tensors, path)}


def features_path(shard: Path) -> Path:
    return shard.with_name(shard.name.removesuffix(".safetensors") + FEATURES_SUFFIX)


def _save_atomic(tensors: dict[str, torch.Tensor], path: Path) -> dict:
    """Write through a temporary file and a rename; the file's size and sha256."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, str(tmp), metadata={"format": FORMAT})
    digest = file_sha256(tmp)
    os.replace(tmp, path)
    return {"bytes": path.stat().st_size, "sha256": digest}


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)


def read_shard(path: Path, features: bool = False) -> Iterator[ShardSequence]:
    """The shard's sequences; with `features` also their final hidden states (the shard's companion file). The
    teacher's distributions and the features are memory-mapped views in their stored dtypes (see ShardSequence)."""
    t = _mapped(path)
    hidden = _mapped(features_path(path))["features"] if features else None  # [N, H] float16
    tok, pos = t["token_offsets"].tolist(), t["position_offsets"].tolist()
    for s, row in enumerate(t["row"].tolist()):
        a, b = pos[s], pos[s + 1]
        yield ShardSequence(
            row=row,
            input_ids=t["input_ids"][tok[s]:tok[s + 1]].long(),
            positions=t["positions"][a:b].long(),
            topk_ids=t["topk_ids"][a:b],
            topk_logprobs=t["topk_logprobs"][a:b],
            rest_mass=t["rest_mass"][a:b],
            features=hidden[tok[s]:tok[s + 1]] if hidden is not None else None,
        )


# safetensors dtypes -> numpy's (bfloat16, which numpy lacks, is mapped as int16 and viewed as bfloat16)
_NUMPY_DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": np.int16, "I32": np.int32, "I64": np.int64,
                 "U16": np.uint16}


def _mapped(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors, memory-mapped, not read: millions of positions (gigabytes) stay on disk and in
    the page cache, shared by every training worker on the machine, until a batch reads them. Copy-on-write, so
    nothing can change the file."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")  # the safetensors layout: header length, JSON header, data
        header = json.loads(f.read(size))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _NUMPY_DTYPES:
            raise TeacherCacheError(f"{path}: {name} is {info['dtype']}, which a teacher cache does not hold")
        start, end = info["data_offsets"]
        dtype = _NUMPY_DTYPES[info["dtype"]]
        if start == end:  # a shard whose rows were all skipped: nothing to map
            tensor = torch.from_numpy(np.zeros(info["shape"], dtype=dtype))
        else:
            tensor = torch.from_numpy(np.memmap(path, dtype=dtype, mode="c", offset=8 + size + start,
                                                shape=tuple(info["shape"])))
        out[name] = tensor.view(torch.bfloat16) if info["dtype"] == "BF16" else tensor
    return out


def read_rest_mass(path: Path) -> torch.Tensor:
    with safe_open(str(path), framework="pt") as f:
        return f.get_tensor("rest_mass")


class TeacherCacheError(ValueError):
    pass


class TeacherCache:
    """Read side, for training: checks the base model it was made with, iterates sequences in order."""

    def __init__(self, directory: Path, expect_fingerprint: str | None = None, verify: bool = False):
        self.dir = Path(directory)
        path = self.dir / "manifest.json"
        if not path.is_file():
            raise TeacherCacheError(f"{self.dir} has no manifest.json: run the teacher stage first")
        self.manifest = json.loads(path.read_text())
        if self.manifest.get("format") != FORMAT or not self.manifest.get("complete"):
            raise TeacherCacheError(f"{path} is not a complete {FORMAT} cache (rerun the teacher stage to finish it)")
        if expect_fingerprint:
            self.check_base(expect_fingerprint)
        if verify:
            for record in self.shards():
                for entry in (record, record.get("features")):
                    if entry and file_sha256(self.dir / record["split"] / entry["file"]) != entry["sha256"]:
                        raise TeacherCacheError(f"shard {entry['file']} does not match its manifest checksum")

    def check_base(self, fingerprint: str) -> None:
        """Refuse a base model other than the one that made the cache."""
        if self.manifest["fingerprint"] != fingerprint:
            raise TeacherCacheError(
                f"teacher cache {self.dir} was made by base model {self.manifest['base_model']} "
                f"({self.manifest['fingerprint'][:19]}), not by the model in use ({fingerprint[:19]})")

    @property
    def compute_dtype(self) -> str:
        """The dtype the teacher computed in (teacher.compute_dtype as its workers resolved it); the passes that
        must see the teacher's model on transformers (features for heads, calibration) use `float_dtype`."""
        return self.manifest["dtype_model"]

    @property
    def teacher_engine(self) -> str:
        """What computed the teacher pass: "runtime" (the decoder's own, runtime/forward/llama.py) or "transformers"
        (caches made before the manifest recorded it, a 4-bit NF4 teacher, a machine without the native kernels)."""
        return self.manifest.get("teacher_engine", "transformers")

    @property
    def float_dtype(self) -> str:
        """The dtype of transformers' model for the passes that run it (calibration, features computed in training):
        the teacher's own, or for a teacher on 4-bit blocks float32: for gguf its weights are the blocks de-quantized
        exactly (only the blocks' int8 activations differ), for q4 those the blocks were quantized from."""
        return "float32" if self.compute_dtype in BLOCK_FORMATS else self.compute_dtype

    @property
    def top_k(self) -> int:
        return self.manifest["top_k"]

    @property
    def vocab_size(self) -> int:
        return self.manifest["vocab_size"]

    def shards(self, split: str | None = None) -> list[dict]:
        records = sorted(self.manifest["shards"].values(), key=lambda r: (r["split"], r["index"]))
        return [r for r in records if split is None or r["split"] == split]

    @property
    def has_features(self) -> bool:
        """Whether every shard keeps the final hidden states (teacher.features)."""
        return bool(self.manifest.get("features")) and all("features" in r for r in self.shards())

    def sequences(self, split: str, features: bool = False) -> Iterator[ShardSequence]:
        """The split's sequences in order; `features` also reads their final hidden states (has_features)."""
        if features and not self.has_features:
            raise TeacherCacheError(f"{self.dir} keeps no features: rerun the teacher stage with teacher.features=true")
        for record in self.shards(split):
            yield from read_shard(self.dir / split / record["file"], features)


def mass_figures(rest: torch.Tensor) -> dict[str, float]:
    kept = 1.0 - rest.double().numpy()
    if kept.size == 0:
        return {"mass_kept_mean": math.nan, "mass_kept_p5": math.nan}
    return {"mass_kept_mean": float(kept.mean()), "mass_kept_p5": float(np.percentile(kept, 5))}
