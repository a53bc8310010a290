"""Linear layers for decoding steps, where a few rows meet large weights and reading the weights is the cost.

Three paths, fastest first where each applies (their costs as measured: docs/history.md):
- the native few-rows matmul (runtime/kernels/skinny_linear.cpp, AVX-512 or AVX2, built on first use): it
  reads each weight once for all of a step's rows, so a few rows cost about one weight read, where oneDNN's
  general kernel spends more; with more rows the arithmetic becomes the limit. 16 to 64 rows go through it in
  balanced passes of at most 15 (weights read per pass).
- oneDNN on weights reordered once into its blocked layout, where the native kernel cannot be built;
- PyTorch's default matmul (MKL) for more rows than the native kernel takes (a prompt on the PyTorch layers;
  with the native decoder layers a prompt goes in blocks of SKINNY_MAX_ROWS, runtime/forward/llama.native_blocks), and
  every matmul on another device (a GPU: the weights are read at its own bandwidth there).
The results differ only in summation order (about 1e-6 relative in float32).

bfloat16 weights (the runtime's `dtype`, runtime/forward/precision.py) take the same native kernel with AVX512-BF16 dot
products: half the bytes to read, two products per lane and instruction; or, where the CPU has them, AMX tiles
(runtime/kernels/native.bf16_kernel), which multiply many rows at once: a tree's rows cost little more than one, where
AVX512-BF16's dot products grow with every row. From the rows where it is faster (timed once per process,
runtime/kernels/native.bf16_fma_rows) the AVX512-BF16 path runs the same panels on float32 FMAs, which give VDPBF16PS's
bits (docs/devices.md#the-bfloat16-kernel). Its
activations stay float32 and are rounded to bfloat16 as the kernel reads them; beyond SKINNY_MAX_ROWS rows
oneDNN's bfloat16 matmul runs on the same weights.

A GGUF's 4-bit and 8-bit blocks (runtime/forward/gguf_blocks.py) take runtime/kernels/quantized_linear.cpp (AVX512-VNNI,
and AMX-INT8 tiles from 16 rows where the CPU has them: the same bits) for every number of rows, prefill too: there
is no other copy of the weights to multiply, and its rows never depend on each other.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..kernels.native import bf16_kernel, native_kernels, tune_bf16_fma
from .gguf_blocks import QuantizedWeight, quantize_q4_1, quantize_q8_0

ROWS_HINT = 64  # the batch oneDNN tunes its layout for; measured as good for 1 to 64 rows
SKINNY_MAX_ROWS = 96  # beyond: the default matmul. Up to here a step's rows go through the native
# kernel, whose rows never depend on each other (passes of at most 15 rows, balanced: 16 rows as 8 + 8); the
# largest tree (64) plus its prompt tokens and lookup rows fits


def _packing_available(dtype: torch.dtype) -> bool:
    return (dtype == torch.float32 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


QUANTIZED = "quantized"  # the weight format of GGUF blocks, beside the torch dtypes


def native_format(dtype: torch.dtype | str, native) -> bool:
    """Whether the native module `native` has a few-rows kernel for weights of `dtype`: the runtime's one table of
    weight formats (float32 and bfloat16: AVX-512 or AVX2, bfloat16 with VDPBF16PS where the CPU has AVX512-BF16;
    GGUF blocks: AVX512-VNNI)."""
    if native is None:
        return False
    return {torch.float32: True, torch.bfloat16: native.bf16_available(),
            QUANTIZED: native.quantized_available()}.get(dtype, False)


class Linear:
    """y = x W^T for x [T, in] and W [out, in], on the fastest path this machine has for T rows. x and y are in
    the activations' dtype; W may be narrower (bfloat16: x is rounded to it, the sums stay float32)."""

    def __init__(self, weight: torch.Tensor | QuantizedWeight, pack: bool = True):
        self.out_features, self.in_features = weight.shape
        if isinstance(weight, QuantizedWeight):  # GGUF blocks: their kernel for every number of rows
            native = native_kernels()
            if not native_format(QUANTIZED, native):
                raise ValueError("GGUF weight blocks need the native kernels built with AVX512-VNNI, which this CPU "
                                 "or build lacks: load the model in float32 or bfloat16")
            self.weight, self.native, self.onednn, self.kernel = None, native, None, None
            self.panels = native.quantized_pack(weight.codes, weight.scale, weight.minimum if weight.minimum
                                                is not None else torch.empty(0))
            return
        self.weight = weight  # as given: the default matmul's operand (it shares the model's storage)
        pack = pack and weight.device.type == "cpu"  # both packed paths are CPU code; elsewhere F.linear
        native = native_kernels() if pack else None
        self.native = native if native_format(weight.dtype, native) else None
        # bfloat16's native kernel: AMX tiles or AVX512-BF16 dot products (native.bf16_kernel); None for the others
        self.kernel = bf16_kernel(native) if self.native and weight.dtype == torch.bfloat16 else None
        if self.kernel == "avx512":
            tune_bf16_fma(self.native)  # VDPBF16PS or FMAs by rows: timed once per process
        self.panels = self.native.pack(weight.contiguous(), self.kernel or "auto") if self.native else None
        self.onednn = None
        if self.native is None and pack and _packing_available(weight.dtype):
            self.onednn = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), ROWS_HINT)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """[..., in] -> [..., out]."""
        rows = x.reshape(-1, self.in_features)  # the kernels take 2-D inputs
        n = rows.shape[0]
        if self.weight is None:  # GGUF blocks
            y = self.native.quantized_linear(rows.float(), self.panels, self.out_features)
        elif self.native is not None and n <= SKINNY_MAX_ROWS and rows.dtype == torch.float32:
            y = self.native.linear(rows, self.panels, self.out_features)  # passes of at most 15 rows
        elif self.onednn is not None:
            y = torch.ops.mkldnn._linear_pointwise(rows, self.onednn, None, "none", [], "")
        else:
            y = F.linear(rows.to(self.weight.dtype), self.weight).to(rows.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)


def draft_blocks(matrices: torch.dtype | str | None, device: torch.device) -> bool:
    """Whether a draft's matrices in format `matrices` (runtime/decoder_loading.draft_matrices) go into GGUF blocks
    on `device`: QUANTIZED asked for, on a CPU (the int8 kernel is CPU code)."""
    return matrices == QUANTIZED and torch.device(device).type == "cpu"


BLOCK_QUANTIZERS = {8: quantize_q8_0, 4: quantize_q4_1}  # a draft's block bits: Q8_0, Q4_1


def draft_layers(blocks: bool, bits: int = 8) -> Callable[[torch.Tensor], Linear]:
    """How a draft's matrices become the runtime's layers: where `blocks` (the int8 kernel, CPU code), in GGUF blocks of
    `bits` (8: Q8_0, 4: Q4_1) cut from float32 copies, else as they are. A draft's states and logits only choose and
    rank its guesses (the verification decides what is kept, so the output stays the base model's whatever they are),
    and drafting reads its weights from memory each level: Q8_0 reads about half bfloat16's bytes and a quarter of
    float32's, Q4_1 two thirds of Q8_0's, so a level takes less time (docs/history.md, docs/tools/draft_blocks.py)."""
    if blocks:
        quantize = BLOCK_QUANTIZERS[bits]
        return lambda weight: Linear(quantize(weight.float()))
    return Linear
