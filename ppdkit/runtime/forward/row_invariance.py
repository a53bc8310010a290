"""The property losslessness rests on, checked at load: a row's result never depends on how many rows share the
step. A tree step computes its root row with the same numbers as `ar`'s one-row step, and each node with the same
numbers as the one-row steps that would have followed it, only if every kernel's result for a row is the same for
1 to the largest step's rows. The native kernels are written so (runtime/kernels/); library kernels (oneDNN,
cuBLAS) may pick another kernel or reduction order for another row count, so this is measured, not assumed.

Steps of one fixed shape (runtime/forward/fixed_shapes.py, the default on a GPU) make library kernels pass too.

`check_rows(decoder)` runs the first decoder layers of the loaded model on random steps of n rows (causal, and a
tree-shaped one) and on the one-row steps they stand for, over the same cache, for n up to the most rows any of
the decoder's methods feeds the model, and refuses the decoder (naming the first n that differed) where they do.
"""

import logging

import torch

from .llama import LeanLlama

log = logging.getLogger(__name__)
CHECK_LAYERS = 2  # every layer runs the same kernels; two cover a layer feeding the next
CONTEXT = 37  # cached tokens before the step: more than two vectors of keys, not a multiple of their width


def first_mismatch(model: LeanLlama, rows: int, seed: int = 0) -> int | None:
    """The smallest n <= rows at which a causal n-row step over CONTEXT cached tokens, or a tree-shaped one
    (_tree_step_agrees), gives a row other than the one-row steps' (through CHECK_LAYERS layers), or None where
    none does."""
    layers = min(CHECK_LAYERS, len(model.layers))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(CONTEXT + rows, model.hidden, generator=g, device="cpu").to(model.device, model.dtype)
    with torch.inference_mode():
        cache = model.new_cache(CONTEXT + rows + 1)
        model.forward_layers(x[:CONTEXT], torch.arange(CONTEXT), cache, None, 0, layers)
        cache.commit(None, CONTEXT)
        single = []
        for i in range(rows):  # what ar computes: one row at a time, each committed
            single.append(model.forward_layers(x[CONTEXT + i:CONTEXT + i + 1], torch.tensor([CONTEXT + i]), cache,
                                               None, 0, layers)[0])
            cache.commit(None, 1)
        single = torch.stack(single)  # [rows, H]
        for n in _counts(rows):
            cache.rollback(CONTEXT)
            step = model.forward_layers(x[CONTEXT:CONTEXT + n], torch.arange(CONTEXT, CONTEXT + n), cache, None, 0,
                                        layers)
            if not torch.equal(step, single[:n]):
                return n
            if n >= 2 and not _tree_step_agrees(model, x, single, cache, n, layers):
                return n
    return None


def _tree_step_agrees(model: LeanLlama, x: torch.Tensor, single: torch.Tensor, cache, n: int, layers: int) -> bool:
    """A tree-shaped step of n rows: a chain of ceil(n/2) rows (what a verified path is) interleaved with rows that
    see only the context (rejected guesses), so each chain row's keys sit at other cache positions than in the
    one-row steps. The chain rows must still give the one-row steps' results."""
    chain = torch.arange(0, n, 2)  # [C] the chain's rows in the step
    order = torch.full((n,), -1)
    order[chain] = torch.arange(len(chain))
    mask = torch.zeros(n, CONTEXT + n, dtype=torch.bool)
    mask[:, :CONTEXT] = True
    mask[:, CONTEXT:] = torch.eye(n, dtype=torch.bool)
    mask[chain[:, None], CONTEXT + chain[None, :]] = chain[None, :] <= chain[:, None]  # the chain sees its prefix
    inputs = x[CONTEXT + order.clamp(min=0)]  # a guess row repeats the first chain row's input
    positions = CONTEXT + order.clamp(min=0)
    cache.rollback(CONTEXT)
    step = model.forward_layers(inputs.to(model.device), positions.to(model.device), cache, mask.to(model.device), 0,
                                layers)
    return torch.equal(step[chain], single[:len(chain)])


def _counts(rows: int) -> list[int]:
    """Every row count up to 16 (each of the native kernel's pass widths), then every fourth and `rows` itself."""
    return sorted({*range(1, min(rows, 16) + 1), *range(20, rows + 1, 4), rows})


def most_rows(decoder) -> int:
    """The most rows one step of any of `decoder`'s methods feeds the model."""
    return max(decoder.step_rows(method) for method in decoder.methods() if method != "auto")


def check_rows(decoder) -> None:
    """Refuse `decoder` where its model's native kernels give a row of a step of up to most_rows(decoder) rows
    other than one-row steps give it (the check costs little next to loading the model). The
    PyTorch layers (a GPU, or a CPU without the native kernels) are checked and only warned about: their library
    softmax and matmuls promise no row invariance (on an H200, cuBLAS differed from 2 rows in float32 and from
    8-24 in bfloat16), and refusing would leave such a device no tree method at all (docs/devices.md)."""
    rows = most_rows(decoder)
    if rows < 2 or decoder.device.type == "meta":
        return
    found = first_mismatch(decoder.model, rows)
    if found is None:
        return
    dtype = decoder.model.weight_format
    said = (f"this machine's {dtype} kernels give a decoding step of {found} rows results other than {found} one-row "
            f"steps, so trees of {found} or more rows could change the output; this decoder's methods need up to "
            f"{rows}")
    if decoder.model.native is None:  # the PyTorch layers: every device but a CPU with the native kernels
        if decoder.device.type == "cpu":
            remedy = (f"install a C++ compiler on an AVX-512 or AVX2 CPU for the native kernels, or pass a tree size "
                      f"below {found}")
        elif decoder.model.fixed_rows is None:
            remedy = (f"on {decoder.device} greedy output through a tree method may then differ from ar's; load it "
                      "with fixed_shapes=True (the default off the CPU), see docs/devices.md")
        else:
            remedy = (f"on {decoder.device} this happened in steps of one shape (fixed_shapes), whose library kernels "
                      "then differ by a row's place in the step: greedy output may differ from ar's, see docs/devices.md")
        log.warning("%s (the PyTorch layers: %s)", said, remedy)
        return
    raise ValueError(f"{said}. Load it with a smaller tree_size (--tree-size), fewer lookup_chains, or dtype float32")
