"""PyTorch twins of the native kernels' arithmetic (runtime/kernels/), rounding for rounding: the tests hold the
native results equal to them bit for bit, so what the kernels compute is written down in a form anyone can read
and run. Slow (a loop over k): for tests and small shapes only."""

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
