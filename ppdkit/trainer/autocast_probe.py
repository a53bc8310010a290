"""train.precision auto (eagle3): the draft's training matmuls in bfloat16 under torch.autocast, or in float32,
whichever this worker runs faster, timed once per process on the draft layer's shapes.

Neither flag of a CPU says which wins: AVX512-BF16 gives a bfloat16 dot product (VDPBF16PS), but on a CPU without
AMX it may issue at a fraction of the rate of float32 FMAs (docs/devices.md#the-bfloat16-kernel), so the same draft
trains markedly faster under autocast on one such CPU and slower on another. Timing the draft layer's own product
where the worker runs settles it for that machine; on a GPU with bfloat16 autocast always wins, so nothing is timed
there (models/device_plan.py).
"""

import logging
import time
from functools import cache

import torch

from ppdkit.models.device_plan import current_device_plan

log = logging.getLogger(__name__)

ROWS, WIDTH, INNER = 1024, 576, 1536  # tokens of a micro-batch, and SmolLM2's layer widths: the product's shape


def use_autocast(precision: str, device: torch.device) -> bool:
    """Whether a run of `precision` (Eagle3Config.precision) trains the draft under bfloat16 autocast on `device`."""
    if precision != "auto":
        return precision == "bf16-autocast"
    choice = current_device_plan(device).autocast
    return choice == "always" or (choice == "timed" and _autocast_is_faster())


@cache
def _autocast_is_faster() -> bool:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, WIDTH, generator=g, requires_grad=True)
    weights = (torch.randn(INNER, WIDTH, generator=g, requires_grad=True),
               torch.randn(WIDTH, INNER, generator=g, requires_grad=True))

    def seconds(autocast: bool) -> float:
        best = float("inf")
        for _ in range(3):  # the fastest of three: the first pays for allocations
            started = time.perf_counter()
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                y = torch.nn.functional.linear(torch.nn.functional.linear(x, weights[0]), weights[1])
            y.float().sum().backward()
            best = min(best, time.perf_counter() - started)
        return best

    bf16, fp32 = seconds(True), seconds(False)
    log.info("train.precision auto: %s (a draft layer's product forward and backward: bfloat16 autocast %.1f ms, "
             "float32 %.1f ms on %d threads)", "bf16-autocast" if bf16 < fp32 else "fp32", 1000 * bf16, 1000 * fp32,
             torch.get_num_threads())
    return bf16 < fp32
