"""The frozen base model's hidden states of training sequences, computed once per sequence and kept.

The base model never changes while heads train, so a sequence's hidden states are the same at every
epoch: one forward without autograd, then kept in float16 (2 * H bytes per position and layer asked for:
1152 for SmolLM2, about 0.2 GB for 512 sequences of 300 tokens). After the first epoch a step costs only
the heads. A sequence past `keep_bytes` is computed at every visit instead (a large cache seen about once:
its features would not fit in memory, and are not read twice anyway).

They come from the engine the teacher pass ran on: where it ran on the decoder's runtime (an unquantized teacher on
the native kernels), on that runtime again (`teacher_runtime`), so features computed here are bit for bit the ones a
teacher with `teacher.features` kept, and the ones the decoder computes while drafting; else through transformers.
"""

import logging

import torch

from ppdkit.data_pipeline.teacher_cache import ShardSequence, TeacherCache
from ppdkit.runtime.ar import read_prompt
from ppdkit.runtime.dtypes import BLOCK_FORMATS
from ppdkit.runtime.eagle3 import states_after
from ppdkit.runtime.llama import LeanLlama

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


class FeatureCache:
    def __init__(self, base_model, layer: int | tuple[int, ...] | None = None, keep_bytes: float = float("inf")):
        """layer None: the final hidden states, after the final norm (what the LM head reads); n: the
        residual stream after the first n decoder layers (no norm); (n1, n2, ..): those concatenated
        (EAGLE-3's low, middle and high states). Through transformers until compute_on names a runtime."""
        self.model, self.layer, self.keep_bytes = base_model, layer, keep_bytes
        self.runtime: LeanLlama | None = None
        self._known: dict[tuple[str, int], torch.Tensor] = {}  # (split, row): a row is unique within its split
        self.kept_bytes = 0

    def __call__(self, seq: ShardSequence, split: str) -> torch.Tensor:
        """[T, H] float32 ([T, n H] for n layers)."""
        if seq.features is not None and self.layer is None:  # the teacher cache kept them (teacher.features)
            return seq.features.float()
        key = (split, seq.row)
        found = self._known.get(key)
        if found is None:
            found = self._compute(seq.input_ids)
            if self.kept_bytes + found.nbytes <= self.keep_bytes:
                self._known[key] = found
                self.kept_bytes += found.nbytes
        return found.float()

    def compute_on(self, runtime: LeanLlama | None) -> None:
        """Compute the features on `runtime` from now on (teacher_runtime; None: through transformers)."""
        self.runtime = runtime

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
