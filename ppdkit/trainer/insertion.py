"""Random insertion with several prompt-token groups per sequence in ONE forward pass.

PPD's reference code truncates each sequence once and appends the prompt tokens (section 4.3.1). Here a
sequence of T ordinary tokens is followed by G groups of k*n EPT tokens; group g stands for an
insertion after position t_g:
- it sees only the ordinary tokens 0..t_g (as if the sequence had been cut there),
- its EPTs see each other as the EPT mask says, never another group,
- its position ids continue from the insertion point: the EPTs of prompt token i sit at t_g + i,
- ordinary tokens see only earlier ordinary tokens, so their outputs are the base model's own.
One forward thus supervises G insertion points for the price of T + G*k*n tokens. In a batch the
groups start at a common column (after the longest sequence), so the ordinary tokens can run first
without gradient and the groups second on their cache (see `student.student_forward`).
"""

import random
from dataclasses import dataclass

import torch

from ppdkit.models.prompt_tokens import MaskKind, ept_mask


@dataclass(frozen=True)
class InsertionLayout:
    position_ids: torch.Tensor  # [L] int64, L = T + G*k*n
    allowed: torch.Tensor  # [L, L] bool: may row attend to column
    group_slots: torch.Tensor  # [G, k*n] int64: where each group's EPTs sit in the L tokens


def build_layout(seq_len: int, insert_after: list[int], k: int, n: int, mask: MaskKind,
                 groups_start: int | None = None) -> InsertionLayout:
    """The token layout and attention of one sequence with one EPT group per insertion point.

    The groups follow the sequence at column `groups_start` (default: right after it); columns in
    between are padding that attends to itself only.
    """
    kn, groups = k * n, len(insert_after)
    groups_start = seq_len if groups_start is None else groups_start
    if groups_start < seq_len:
        raise ValueError(f"groups_start {groups_start} would overlap a sequence of {seq_len} tokens")
    length = groups_start + groups * kn
    allowed = torch.eye(length, dtype=torch.bool)
    allowed[:seq_len, :seq_len] = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()  # causal ordinary tokens
    within = ept_mask(k, n, mask)  # [kn, kn]
    distance = torch.arange(kn) // n + 1  # [kn]: prompt token i = 1..k of each slot
    position_ids = torch.zeros(length, dtype=torch.long)
    position_ids[:seq_len] = torch.arange(seq_len)
    slots = torch.zeros(groups, kn, dtype=torch.long)
    for g, t in enumerate(insert_after):
        if not 0 <= t < seq_len:
            raise ValueError(f"insertion point {t} outside a sequence of {seq_len} tokens")
        start = groups_start + g * kn
        slots[g] = torch.arange(start, start + kn)
        allowed[start:start + kn, :t + 1] = True  # the prefix up to the insertion point
        allowed[start:start + kn, start:start + kn] = within
        position_ids[start:start + kn] = t + distance
    return InsertionLayout(position_ids, allowed, slots)


def draw_insertion_points(eligible: list[int], groups: int, rng: random.Random) -> list[int]:
    """Up to `groups` distinct insertion points from `eligible`, sorted (redrawn every epoch by the caller)."""
    if groups >= len(eligible):
        return sorted(eligible)
    return sorted(rng.sample(eligible, groups))


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, L, L] bool -> [B, 1, L, L] additive mask (0 where allowed, the dtype's min elsewhere)."""
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]
