"""The frozen base model's hidden states of training sequences, computed once per sequence and kept.

The base model never changes while heads train, so a sequence's hidden states are the same at every
epoch: one forward without autograd, then kept in float16 (2 * H bytes per position and layer asked for:
1152 for SmolLM2, about 0.2 GB for 512 sequences of 300 tokens). After the first epoch a step costs only
the heads. A sequence past `keep_bytes` is computed at every visit instead (a large cache seen about once:
its features would not fit in memory, and are not read twice anyway).
"""

import torch

from ppdkit.data_pipeline.teacher_cache import ShardSequence


class FeatureCache:
    def __init__(self, base_model, layer: int | tuple[int, ...] | None = None, keep_bytes: float = float("inf")):
        """layer None: the final hidden states, after the final norm (what the LM head reads); n: the
        residual stream after the first n decoder layers (no norm); (n1, n2, ..): those concatenated
        (EAGLE-3's low, middle and high states)."""
        self.model, self.layer, self.keep_bytes = base_model, layer, keep_bytes
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

    def _compute(self, ids: torch.Tensor) -> torch.Tensor:
        """[T, H] float16, or [T, n H] bfloat16 (the residual stream inside the model: float16's range may not
        hold its outlier channels)."""
        with torch.no_grad():
            out = self.model.get_decoder()(input_ids=ids[None], output_hidden_states=self.layer is not None)
        if self.layer is None:
            hidden = out.last_hidden_state
        elif isinstance(self.layer, int):
            hidden = out.hidden_states[self.layer]
        else:
            return torch.cat([out.hidden_states[n] for n in self.layer], dim=-1)[0].to(torch.bfloat16)
        return hidden[0].to(torch.float16)
