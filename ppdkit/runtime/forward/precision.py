"""The runtime's precision: which dtype the base model's weights are held in, and what `auto` picks here.

- `float32`: weights, activations and sums in float32 (the float32 model's own tokens).
- `bfloat16`: the weights in bfloat16, packed for the native kernel (half the bytes of a step; AVX512-BF16's two
  products per lane and instruction where the CPU has them, float32 FMAs on the same bits elsewhere); transformers' model, kept for the bench's baselines, is loaded in it too. Activations, norms, the rotary tables and the KV cache stay float32:
  each matmul rounds its input to bfloat16 as it reads it, multiplies exactly and sums in float32, and attention
  accumulates in float32 over float32 keys and values. The cache is a few percent of a step's bytes at the
  contexts served here (30 layers x 3 KV heads x 64 x 2 x 4 bytes = 46 KB a token), so keeping it float32 costs
  little and adds no second rounding; the weights are where bfloat16 pays.
- `gguf`: the matmuls multiply the base model's own GGUF blocks (runtime/forward/gguf_blocks.py: Q4_1 layers, a Q8_0
  embedding as the tied head) on the AVX512-VNNI kernel, with each row's activations quantized to int8 per block of
  32; everything else float32. The weights are those the float32 model holds (its conversion de-quantized the same
  blocks); the int8 activations make its tokens its own, as every format's are.
- `q4`: the same format for any base model, its float weights quantized by ppdkit into Q4_1 blocks (the layers) and
  Q8_0 (the output head) with llama.cpp's reference quantizer.
- `auto` (the default): gguf where the base model comes with a GGUF (SmolLM2's Q4_1) and the CPU runs the native
  AVX512-VNNI kernel: the fastest format there (a step reads its weights, and 4-bit blocks are a fraction of
  bfloat16's bytes), row-invariant and lossless like the others. Else bfloat16 where it runs fast and
  row-invariant: a CPU the native kernels are built for (AVX-512, or AVX2 with FMA, where bfloat16's half of
  float32's bytes makes a step ~1.3x faster), or a GPU; float32 elsewhere, saying so in one line.
  Callers that compute on transformers' model (the
  teacher) pass no base model: for them auto is bfloat16 or float32, never a block format.
bfloat16 gives the bfloat16 model's tokens, not the float32 model's: every method is lossless against `ar` in the
same dtype. Who needs the float32 model's exact tokens passes `float32`.
"""

import logging

import torch

from ppdkit.models.catalog import BASE_GGUFS

from . import linear
from .dtypes import AUTO, BLOCK_FORMATS, DTYPES, GGUF

log = logging.getLogger(__name__)

TEST_DTYPES = ("float64",)  # also accepted from Python: the tests compare tokens with transformers' in it


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16": the name the command line, reports and cache keys use."""
    return str(dtype).removeprefix("torch.")


def activation_dtype(weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype activations, norms and the KV cache are computed in for weights of `weight_dtype`: float32 for
    the 16-bit formats, the weights' own otherwise."""
    return torch.float32 if weight_dtype in (torch.bfloat16, torch.float16) else weight_dtype


def bf16_kernels_here() -> bool:
    """Whether this CPU runs the native bfloat16 few-rows kernel (any build of the native kernels)."""
    return linear.native_format(torch.bfloat16, linear.native_kernels())


def gguf_kernels_here() -> bool:
    """Whether this CPU runs the native kernel of GGUF blocks (AVX512-VNNI, built for it)."""
    return linear.native_format(linear.QUANTIZED, linear.native_kernels())


def resolve_dtype(requested: str, device: torch.device | str = "cpu", base_name: str | None = None) -> str:
    """`requested` (auto, float32, bfloat16, gguf, q4) -> the dtype the decoder runs on `device`, with one line where
    bfloat16, gguf or q4 cannot run fast and row-invariant here (gguf and q4 then fall back to what auto picks).
    `base_name`: the base model the runtime will hold, for auto's gguf (None: a float format only)."""
    if requested not in DTYPES + TEST_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {requested!r}")
    if requested == AUTO and base_name in BASE_GGUFS and torch.device(device).type == "cpu" and gguf_kernels_here():
        log.info("dtype auto: gguf (%s's own GGUF blocks on this CPU's AVX512-VNNI kernel)", base_name)
        return GGUF
    if requested in BLOCK_FORMATS:
        if torch.device(device).type == "cpu" and gguf_kernels_here():
            return requested
        log.warning("%s weights need the native AVX512-VNNI kernels on a CPU, which this device, CPU or build lacks: "
                    "running what auto picks", requested)
        requested = AUTO
    if requested not in (AUTO, "bfloat16"):
        return requested
    if torch.device(device).type != "cpu" or bf16_kernels_here():
        return "bfloat16"
    if requested == "bfloat16":
        log.warning("bfloat16 needs the native kernels, which this CPU or build lacks (neither AVX-512 nor AVX2 with "
                    "FMA, no C++ compiler, or PPDKIT_NATIVE_KERNELS=0): running float32")
    else:
        log.info("dtype auto: float32 (this CPU runs no native bfloat16 kernel)")
    return "float32"
