"""The frozen base model's hidden states of training sequences, computed once per sequence and kept.

The base model never changes while heads train, so a sequence's hidden states are the same at every
epoch: one forward without autograd, then kept in float16 (2 * H bytes per position and layer asked for:
1152 for SmolLM2, about 0.2 GB for 512 sequences of 300 tokens). After the first epoch a step costs only
the heads. A sequence past `keep_bytes` is computed at every visit instead, unless `keep_on_disk` names a
directory (train.features_on_disk): there each sequence's states are written once, one safetensors file per
sequence beside the teacher cache (`feature_store`), and read back by every later epoch and every later run on the
same cache and layers, whichever worker visits it (epochs reshuffle sequences across workers). A file records the
digest of the token ids it was computed from, so one left by an older cache is computed again, not trusted.

They come from the engine the teacher pass ran on: where it ran on the decoder's runtime (an unquantized teacher on
the native kernels), on that runtime again (`teacher_runtime`), so features computed here are bit for bit the ones a
teacher with `teacher.features` kept, and the ones the decoder computes while drafting; else through transformers.
"""

import hashlib
import logging
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ppdkit.data_pipeline.teacher_cache import ShardSequence, TeacherCache
from ppdkit.runtime.drafters.drafter import read_prompt
from ppdkit.runtime.forward.dtypes import BLOCK_FORMATS
from ppdkit.runtime.forward.layer_states import states_after
from ppdkit.runtime.forward.llama import LeanLlama

log = logging.getLogger(__name__)


def teacher_runtime(base_model, cache: TeacherCache) -> LeanLlama | None:
    """The decoder's runtime over `base_model` (loaded in the cache's float_dtype) where the teacher pass of `cache`
    ran on it; None: transformers (the teacher ran there; or on 4-bit blocks, which the trainer holds de-quantized in
    float32)."""
    if cache.teacher_engine != "runtime" or cache.compute_dtype in BLOCK_FORMATS:
        return None
    runtime = LeanLlama(base_model) if next(base_model.parameters()).device.type == "cpu" else None
    if runtime is None or runtime.native is None:
        log.warning("the teacher cache %s was computed on the runtime's native kernels, which cannot run here: "
                    "features come from transformers instead (they differ in the last bits)", cache.dir)
        return None
    return runtime


STORE_DIR = "base-states"  # under the teacher cache's directory: one folder per layers / engine / dtype


def feature_store(cache: TeacherCache, layer: int | tuple[int, ...] | None, runtime: LeanLlama | None) -> Path:
    """Where train.features_on_disk keeps `cache`'s sequences' hidden states after `layer` (FeatureCache's), as
    computed on `runtime` (None: transformers) in the cache's float dtype: a folder per kind of states, so runs of
    other methods or layers on the same cache never read each other's."""
    layers = "final" if layer is None else "layers-" + "-".join(map(str, (layer,) if isinstance(layer, int) else layer))
    engine = "runtime" if runtime is not None else "transformers"
    return Path(cache.dir) / STORE_DIR / f"{layers}.{engine}.{cache.float_dtype}"


def ids_digest(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


class FeatureCache:
    def __init__(self, base_model, layer: int | tuple[int, ...] | None = None, keep_bytes: float = float("inf")):
        """layer None: the final hidden states, after the final norm (what the LM head reads); n: the
        residual stream after the first n decoder layers (no norm); (n1, n2, ..): those concatenated
        (EAGLE-3's low, middle and high states). Through transformers until compute_on names a runtime."""
        self.model, self.layer, self.keep_bytes = base_model, layer, keep_bytes
        self.runtime: LeanLlama | None = None
        self._known: dict[tuple[str, int], torch.Tensor] = {}  # (split, row): a row is unique within its split
        self.kept_bytes = 0
        self.store: Path | None = None  # keep_on_disk's directory

    def __call__(self, seq: ShardSequence, split: str) -> torch.Tensor:
        """[T, H] float32 ([T, n H] for n layers)."""
        # the teacher cache kept them (teacher.features: final states), or train.online computed this layer's
        if seq.features is not None and getattr(seq, "features_layer", None) == self.layer:
            return seq.features.float()
        key = (split, seq.row)
        found = self._known.get(key)
        if found is None:
            found = self._read(seq, split) if self.store is not None else None
            if found is None:
                found = self._compute(seq.input_ids)
                if self.store is not None:
                    self._write(seq, split, found)
            if self.kept_bytes + found.nbytes <= self.keep_bytes:
                self._known[key] = found
                self.kept_bytes += found.nbytes
        return found.float()

    def compute_on(self, runtime: LeanLlama | None) -> None:
        """Compute the features on `runtime` from now on (teacher_runtime; None: through transformers)."""
        self.runtime = runtime

    def keep_on_disk(self, directory: Path, positions: int, hidden: int) -> None:
        """Read computed states from `directory` (feature_store's) where a file holds them, write them there where
        none does. `positions`: the training sequences' tokens, `hidden` the base's width: what the log line says
        the folder will take."""
        self.store = Path(directory)
        layers = 1 if self.layer is None or isinstance(self.layer, int) else len(self.layer)
        there = sum(1 for _ in (self.store / "train").glob("*.safetensors")) if (self.store / "train").is_dir() else 0
        log.info("train.features_on_disk: the base's states of the training sequences in %s (%d bytes a position, "
                 "about %.1f GB in all; files there already: %d)", self.store, 2 * hidden * layers,
                 2 * hidden * layers * positions / 1e9, there)

    def _path(self, seq: ShardSequence, split: str) -> Path:
        return self.store / split / f"{seq.row}.safetensors"

    def _read(self, seq: ShardSequence, split: str) -> torch.Tensor | None:
        path = self._path(seq, split)
        if not path.exists():
            return None
        try:
            with safe_open(str(path), framework="pt") as f:
                if (f.metadata() or {}).get("ids_sha256") != ids_digest(seq.input_ids):
                    log.warning("%s holds another sequence's states (a cache rebuilt since): computing them again",
                                path)
                    return None
                return f.get_tensor("states")
        except (SafetensorError, OSError) as err:  # a truncated file (a full disk): computed and written again
            log.warning("cannot read %s (%s): computing its states again", path, err)
            return None

    def _write(self, seq: ShardSequence, split: str, states: torch.Tensor) -> None:
        """One file a sequence, written under a temporary name and renamed: a reader (another worker) sees the whole
        file or none, and two workers writing the same sequence leave the same bytes."""
        path = self._path(seq, split)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        save_file({"states": states.contiguous()}, str(partial), metadata={"ids_sha256": ids_digest(seq.input_ids)})
        os.replace(partial, path)

    def _compute(self, ids: torch.Tensor) -> torch.Tensor:
        """[T, H] float16, or [T, n H] bfloat16 (the residual stream inside the model: float16's range may not
        hold its outlier channels)."""
        if self.runtime is not None:
            return self._on_runtime(ids)
        with torch.no_grad():
            out = self.model.get_decoder()(input_ids=ids[None], output_hidden_states=self.layer is not None)
        if self.layer is None:
            hidden = out.last_hidden_state
        elif isinstance(self.layer, int):
            hidden = out.hidden_states[self.layer]
        else:
            return torch.cat([out.hidden_states[n] for n in self.layer], dim=-1)[0].to(torch.bfloat16)
        return hidden[0].to(torch.float16)

    def _on_runtime(self, ids: torch.Tensor) -> torch.Tensor:
        """_compute's result read as `ar` reads a prompt (the teacher's runtime_teacher_sequences for final states)."""
        rt = self.runtime
        with torch.no_grad():
            if self.layer is None:
                return read_prompt(rt, ids, rt.new_cache(len(ids))).to(torch.float16)
            layers = (self.layer,) if isinstance(self.layer, int) else self.layer
            _, states = states_after(rt, rt.embed_ids(ids), torch.arange(len(ids)), rt.new_cache(len(ids)), None,
                                     layers)  # [T, n H]: the layers above the last asked for are not run
        return states.to(torch.float16 if isinstance(self.layer, int) else torch.bfloat16)
