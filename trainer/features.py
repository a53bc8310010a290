"""The frozen base model's hidden states of training sequences, computed once per sequence and kept.

The base model never changes while heads train, so a sequence's hidden states are the same at every
epoch: one forward without autograd, then kept in float16 (2 * H bytes per position and layer asked for:
1152 for SmolLM2, about 0.2 GB for 512 sequences of 300 tokens). After the first epoch a step costs only
the heads.
"""

import torch

from ppdkit.data_pipeline.teacher_cache import ShardSequence


class FeatureCache:
    def __init__(self, base_model, layer: int | None = None):
        """layer None: the final hidden states, after the final norm (what the LM head reads); n: the
        residual stream after the first n decoder layers (no norm)."""
        self.model, self.layer = base_model, layer
        self._known: dict[tuple[str, int], torch.Tensor] = {}  # (split, row): a row is unique within its split

    def __call__(self, seq: ShardSequence, split: str) -> torch.Tensor:
        """[T, H] float32."""
        if seq.features is not None and self.layer is None:  # the teacher cache kept them (teacher.features)
            return seq.features.float()
        key = (split, seq.row)
        if key not in self._known:
            with torch.no_grad():
                out = self.model.get_decoder()(input_ids=seq.input_ids[None],
                                               output_hidden_states=self.layer is not None)
            hidden = out.last_hidden_state if self.layer is None else out.hidden_states[self.layer]
            self._known[key] = hidden[0].to(torch.float16)
        return self._known[key].float()
