"""PyTorch twins of the native kernels' arithmetic (runtime/kernels/), rounding for rounding: the tests hold the
native results equal to them bit for bit, so what the kernels compute is written down in a form anyone can read
and run. Slow (a loop over k, or over blocks): for tests and small shapes only."""

import torch

FLOAT32_TINY = 2.0 ** -126  # the smallest normal float32: AVX512-BF16 flushes anything smaller to zero


def _flush(x: torch.Tensor) -> torch.Tensor:
    """Denormals to zero, as VDPBF16PS treats its inputs and results (DAZ, FTZ)."""
    return torch.where(x.abs() < FLOAT32_TINY, torch.zeros_like(x), x)


def bf16_linear_twin(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32, weight [N, K] bfloat16 -> [M, N] float32, as skinny_linear.cpp's bfloat16 path computes it:
    x rounded to bfloat16 (to nearest even), then per k-pair (k, k + 1), k even and in order, the float32 sum
    gains the exact product of the odd element, rounded, then the even one's, rounded (VDPBF16PS's order)."""
    m, k = x.shape
    xb = _flush(x.to(torch.bfloat16).float())  # [M, K]
    wb = _flush(weight.float())  # [N, K]
    if k % 2:  # the packed weight pads K to even with zeros
        xb, wb = torch.nn.functional.pad(xb, (0, 1)), torch.nn.functional.pad(wb, (0, 1))
    acc = torch.zeros(m, weight.shape[0])
    for pair in range(0, xb.shape[1], 2):
        for j in (pair + 1, pair):  # odd first
            acc = _flush(acc + _flush(xb[:, j, None] * wb[None, :, j]))  # products of two bfloat16 are exact
    return acc


def reciprocal_or_zero(d: torch.Tensor, numerator: float = 1.0) -> torch.Tensor:
    """numerator / d elementwise, one float32 division each, and 0 where d is 0 (a block of zeros quantizes to zero
    codes): the inverse scale that every block quantizer here multiplies by."""
    nonzero = d != 0
    return torch.where(nonzero, numerator / torch.where(nonzero, d, torch.ones(())), torch.zeros(()))


def q8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] float32 (K a multiple of 32) -> the activations as the 4-bit format's kernels take them, per row
    and block of 32: (codes [M, K / 32, 32] int8, scale [M, K / 32] float32, scale * sum of codes [M, K / 32]).
    scale = amax / 127 and codes = round-half-even(x * (127 / amax)), each a float32 operation rounded once; a block
    of zeros has scale 0 and codes 0. A row's codes depend on that row alone."""
    m, k = x.shape
    blocks = x.reshape(m, k // 32, 32)
    amax = blocks.abs().amax(-1)  # [M, K / 32]
    inverse = reciprocal_or_zero(amax, 127.0)
    codes = torch.round(blocks * inverse[..., None]).to(torch.int8)
    scale = amax / 127.0
    return codes, scale, scale * codes.sum(-1, dtype=torch.int32).float()


def quantized_linear_twin(x: torch.Tensor, weight) -> torch.Tensor:
    """x [M, K] float32, weight a runtime/forward/gguf_blocks.QuantizedWeight [N, K] -> [M, N] float32: the 4-bit
    format's arithmetic, the contract its native few-rows kernels are held to bit for bit. The activations are q8_rows';
    per block b in order, the exact integer sum s = sum_j qw * qx (|s| < 2^24, so exact as float32 too) enters the
    float32 sum as
        acc = acc + (dw * dx) * s,   then for Q4_1   acc = acc + mw * (dx * sum_j qx)
    every product and sum rounded once, in this order: the same operations for a row whatever rows are beside it."""
    codes, dx, dx_sum = q8_rows(x)  # [M, B, 32], [M, B], [M, B]
    sums = torch.einsum("mbj,nbj->mnb", codes.long(), weight.codes.long()).float()  # [M, N, B] exact
    acc = torch.zeros(x.shape[0], weight.shape[0])
    for b in range(codes.shape[1]):
        acc = acc + (weight.scale[None, :, b] * dx[:, None, b]) * sums[:, :, b]
        if weight.minimum is not None:
            acc = acc + weight.minimum[None, :, b] * dx_sum[:, None, b]
    return acc
