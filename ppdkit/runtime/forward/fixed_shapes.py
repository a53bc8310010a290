"""Decoding steps of one fixed shape, so that a row's result never depends on the step it is in: lossless tree
decoding on the PyTorch layers (a GPU), where the library kernels promise nothing about rows.

cuBLAS, and torch's own reductions, pick a kernel (tiling, split of the sums, threads per row) by the shapes of
their operands; on an H200 a row's result changed with the step's row count from 2 rows in float32 and from 8-24
in bfloat16 (docs/devices.md), so greedy output through a tree differed from `ar`'s. Here every operation of a
step has the same shape whatever the step:
- a step's rows are padded to ROWS (longer inputs, a prompt's prefill, go in blocks of ROWS, each a step of its
  own whose rows see the blocks before it), and so are the final norm's and the LM head's rows;
- attention multiplies each row's queries with every slot of the KV cache, whose capacity is fixed for the
  decoder (its max_length plus room for a step), then puts each row's visible keys in one canonical order, by
  position (ties by slot), padded to that capacity: the keys a verified row at position p sees are the cached
  positions and its ancestors, which `ar` had cached as positions 0..p in that order, so both compute the same
  softmax over the same list and the same weighted sum of the same gathered values.
Fixed shapes cost rows (an `ar` step computes ROWS rows) and a gather of the values per row: on a GPU, whose
steps are bound by launches rather than arithmetic, `ar` lost about a fifth of its speed (an H200, where every method
then gave `ar`'s tokens: docs/devices.md); on a CPU the native kernels are row-invariant by construction and need
none of this.
"""

import math

import torch
import torch.nn.functional as F

ROWS = 96  # a step's rows (linear.py's SKINNY_MAX_ROWS: the largest tree plus its prompt and lookup rows)
ROOM = 64  # cache slots beyond max_length: a step's rows are written after the committed tokens


def capacity(max_positions: int, rows: int) -> int:
    """The KV cache's slots for a decoder of `max_positions`: fixed, so that the attention's shapes are."""
    return max_positions + ROOM + rows


def in_blocks(fn, x: torch.Tensor, rows: int) -> torch.Tensor:
    """fn applied to x [..., H] in blocks of exactly `rows` rows (the last one padded with zeros): row-wise
    functions (a norm, the LM head) then see one shape whatever the number of rows."""
    flat = x.reshape(-1, x.shape[-1])
    n = flat.shape[0]
    padded = F.pad(flat, (0, 0, 0, -n % rows))
    out = torch.cat([fn(block) for block in padded.split(rows)])[:n]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def key_order(positions: torch.Tensor, length: int, first: int, count: int, mask: torch.Tensor | None, rows: int,
              slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which cache slots each row of a block sees, in canonical order.

    positions [T]: the step's rows' positions, written at slots length + 0 .. T - 1; the block is rows
    first .. first + count - 1, padded to `rows`. mask [T, length + T] (True: may attend) or None (causal).
    Returns order [rows, slots] (slot indices: the visible ones by position, ties by slot, then slot 0 as filler)
    and visible [rows, slots] (False on the fillers). A padding row sees slot 0 alone, so that its softmax stays
    finite."""
    device = positions.device
    slot = torch.arange(slots, device=device)
    written = length + first + count  # slots holding keys once this block is written
    visible = torch.zeros(rows, slots, dtype=torch.bool, device=device)
    if mask is None:
        visible[:count] = slot[None] < (length + first + 1 + torch.arange(count, device=device))[:, None]
    else:
        block = mask[first:first + count]
        if bool(block[:, written:].any()):
            raise ValueError("a row of the step sees a later row: fixed-shape steps run the step in blocks, in order")
        visible[:count, :written] = block[:, :written]
    visible[count:, 0] = True
    slot_position = torch.cat([torch.arange(length, device=device), positions.to(device)[:first + count]])
    slot_position = F.pad(slot_position, (0, slots - written), value=0)
    rank = slot_position * slots + slot  # [S] position first, slot second: distinct, so the order is total
    rank = torch.where(visible, rank[None], torch.iinfo(torch.int64).max)
    sorted_rank, order = rank.sort(dim=-1)
    return order, sorted_rank != torch.iinfo(torch.int64).max


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, order: torch.Tensor,
              visible: torch.Tensor) -> torch.Tensor:
    """q [Hkv, g, R, D] (a key/value head's group of query heads), keys [Hkv, D, S] and values [Hkv, S, D] (the
    whole cache of one layer), order/visible [R, S] from key_order -> [R, Hkv, g, D]."""
    hkv, g, r, d = q.shape
    s = keys.shape[-1]
    scores = torch.matmul(q.reshape(hkv, g * r, d), keys).view(hkv, g, r, s)  # [Hkv, g, R, S] every slot
    scores = scores.gather(-1, order.expand(hkv, g, r, s)).mul_(1.0 / math.sqrt(d))  # canonical order
    probs = scores.masked_fill_(~visible, float("-inf")).softmax(-1)
    gathered = values[:, order]  # [Hkv, R, S, D] each row's values in its order
    return torch.matmul(probs.transpose(1, 2), gathered).transpose(0, 1)  # [R, Hkv, g, D]
