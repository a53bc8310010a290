"""A GGUF file's quantized weights as the file stores them: its blocks read exactly, never re-quantized.

The runtime's block formats (dtype gguf and q4, runtime/forward/precision.py) multiply these blocks directly, so the
weights it decodes with are bit for bit the ones llama.cpp decodes the same file with. Two block types, llama.cpp's layouts:

    Q4_1  32 weights in 20 bytes: scale d (float16), minimum m (float16), 16 bytes of 4-bit codes q (weight j < 16
          in the low nibble of byte j, weight j >= 16 in the high nibble of byte j - 16); w = d * q + m
    Q8_0  32 weights in 34 bytes: scale d (float16), 32 int8 codes q; w = d * q

Dequantized in float32 (d * q, rounded, then + m, rounded: the order of the gguf package's dequantize, which
transformers' GGUF loader uses), they equal the weights of the safetensors model converted from the same file
(models/smollm2.py). Names are mapped to the Hugging Face model's, and the query and key rows are put back in its
order: llama.cpp's converter interleaves each head's rotary halves, a permutation of whole rows (blocks run
along a row, so a row permutation moves whole blocks). For a base model without a GGUF, quantize_model makes the
same blocks from its float weights as llama.cpp's reference quantizer does (dtype q4).
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..kernels.twin import reciprocal_or_zero

BLOCK = 32  # weights per block, both types


@dataclass(frozen=True)
class QuantizedWeight:
    """A [N, K] weight as blocks of 32 along K: w[n, b * 32 + j] = scale[n, b] * codes[n, b, j] + minimum[n, b]."""

    kind: str  # "Q4_1" or "Q8_0"
    scale: torch.Tensor  # [N, K / 32] float32 (from float16: exact)
    codes: torch.Tensor  # [N, K / 32, 32] uint8 in 0..15 (Q4_1) or int8 (Q8_0), in weight order
    minimum: torch.Tensor | None  # [N, K / 32] float32 (Q4_1), None (Q8_0)

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.codes.shape[1] * BLOCK

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32, rounded as the gguf package rounds: the product d * q, then the sum with m."""
        w = self.scale[..., None] * self.codes.float()  # [N, K / 32, 32]
        if self.minimum is not None:
            w = w + self.minimum[..., None]
        return w.reshape(self.shape)

    def take_rows(self, index: torch.Tensor) -> "QuantizedWeight":
        """The rows `index` [N'] of the weight, blocks unchanged."""
        return QuantizedWeight(self.kind, self.scale[index], self.codes[index],
                               None if self.minimum is None else self.minimum[index])


def concat_rows(weights: list[QuantizedWeight]) -> QuantizedWeight:
    """One weight of the rows of several (the runtime's fused query/key/value and gate/up matmuls)."""
    kinds = {w.kind for w in weights}
    if len(kinds) != 1:
        raise ValueError(f"a fused matmul's weights must share one block type, not {sorted(kinds)}")
    minimums = [w.minimum for w in weights]
    return QuantizedWeight(weights[0].kind, torch.cat([w.scale for w in weights]),
                           torch.cat([w.codes for w in weights]),
                           None if minimums[0] is None else torch.cat(minimums))


def _per_block(weight: torch.Tensor) -> torch.Tensor:
    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"a [{n}, {k}] weight cannot be cut into blocks of {BLOCK} along its input width: the "
                         "4-bit format needs every matmul's input width to be a multiple of 32 (use bfloat16)")
    return weight.float().reshape(n, k // BLOCK, BLOCK)


def quantize_q4_1(weight: torch.Tensor) -> QuantizedWeight:
    """[N, K] float -> Q4_1 blocks as llama.cpp's reference quantizer makes them: per block d = (max - min) / 15,
    codes min(15, floor((w - min) / d + 0.5)), then d and min stored as float16."""
    blocks = _per_block(weight)  # [N, B, 32]
    low, high = blocks.amin(-1), blocks.amax(-1)  # [N, B]
    d = (high - low) / 15
    inverse = reciprocal_or_zero(d)  # d >= 0
    codes = torch.floor((blocks - low[..., None]) * inverse[..., None] + 0.5).clamp(0, 15).to(torch.uint8)
    return QuantizedWeight("Q4_1", d.half().float(), codes, low.half().float())


def quantize_q8_0(weight: torch.Tensor) -> QuantizedWeight:
    """[N, K] float -> Q8_0 blocks as llama.cpp's reference quantizer makes them: d = amax / 127, codes rounded
    half away from zero, d stored as float16."""
    blocks = _per_block(weight)
    d = blocks.abs().amax(-1) / 127  # [N, B]
    inverse = reciprocal_or_zero(d)  # d >= 0
    scaled = blocks * inverse[..., None]
    codes = (scaled.sign() * torch.floor(scaled.abs() + 0.5)).to(torch.int8)
    return QuantizedWeight("Q8_0", d.half().float(), codes, None)


def quantize_model(model) -> dict[str, QuantizedWeight]:
    """A Llama-family Hugging Face model's matmul weights as the layout of SmolLM2's GGUF: every decoder layer's
    projections Q4_1, the output head (the embedding, where tied) Q8_0. For base models that come without a GGUF."""
    state = model.state_dict()
    out = {name: quantize_q4_1(w) for name, w in state.items()
           if name.startswith("model.layers.") and name.endswith("_proj.weight")}
    head = "lm_head.weight" if not model.config.tie_word_embeddings else "model.embed_tokens.weight"
    out[head] = quantize_q8_0(state[head])
    return out


def _blocks(kind: str, raw: np.ndarray) -> QuantizedWeight:
    """raw [N, bytes per row] uint8, as GGUFReader gives a quantized tensor."""
    n = raw.shape[0]
    size = {"Q4_1": 20, "Q8_0": 34}[kind]
    b = raw.reshape(n, -1, size)  # [N, K / 32, bytes per block]
    scale = torch.from_numpy(np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0].astype(np.float32))
    if kind == "Q8_0":
        codes = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8))
        return QuantizedWeight(kind, scale, codes, None)
    minimum = torch.from_numpy(np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0].astype(np.float32))
    packed = b[..., 4:]  # [N, K / 32, 16]
    codes = torch.from_numpy(np.concatenate([packed & 0x0F, packed >> 4], axis=-1))  # weights 0-15, then 16-31
    return QuantizedWeight(kind, scale, codes, minimum)


def unpermute_rotary_rows(rows: int, heads: int) -> torch.Tensor:
    """[rows]: for each row of the Hugging Face query (or key) weight, its row in the GGUF. llama.cpp's converter
    reorders each head's rows from (half, pair) to (pair, half): Hugging Face row h * D + s * D / 2 + i sits at
    GGUF row h * D + 2 i + s."""
    d = rows // heads
    h, s, i = torch.meshgrid(torch.arange(heads), torch.arange(2), torch.arange(d // 2), indexing="ij")
    return (h * d + 2 * i + s).reshape(-1)


# GGUF tensor name (per layer: blk.{i}.<name>) -> the Hugging Face model's
_LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}

_MODEL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight"}


def read_quantized_weights(path: Path, heads: int, kv_heads: int) -> dict[str, QuantizedWeight]:
    """The quantized matrices of a Llama-family GGUF, by their Hugging Face names (model.layers.{i}.self_attn.q_proj
    .weight, ..., model.embed_tokens.weight, lm_head.weight where not tied), in the Hugging Face rows' order. Unquantized tensors (norms) are left
    to the Hugging Face model."""
    from gguf import GGUFReader

    out = {}
    for tensor in GGUFReader(str(path)).tensors:
        kind = tensor.tensor_type.name
        if kind not in ("Q4_1", "Q8_0"):
            continue
        name = tensor.name
        if name in _MODEL_NAMES:
            hf = _MODEL_NAMES[name]
        elif name.startswith("blk.") and name.split(".")[2] in _LAYER_NAMES:
            layer, short = name.split(".")[1:3]
            hf = f"model.layers.{layer}.{_LAYER_NAMES[short]}.weight"
        else:
            raise ValueError(f"{path}: quantized tensor {name} has no place in a Llama-family model")
        weight = _blocks(kind, np.asarray(tensor.data))
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            weight = weight.take_rows(unpermute_rotary_rows(weight.shape[0], heads if "attn_q" in name else kv_heads))
        out[hf] = weight
    return out
