"""Batches for prompt-token training: teacher-cache sequences -> multi-insertion layouts, padded."""

import random
from dataclasses import dataclass, fields, replace

import torch

from ppdkit.data_pipeline.teacher_cache import ShardSequence
from ppdkit.models.prompt_tokens import MaskKind

from .insertion import additive_mask, build_layout, draw_insertion_points


@dataclass
class TrainBatch:
    ordinary_len: int  # columns [0, ordinary_len) hold the ordinary tokens (padded), the groups follow
    input_ids: torch.Tensor  # [B, L] ordinary token ids (0 at EPT slots and padding)
    ept_slot: torch.Tensor  # [B, L] which of the k*n EPT embeddings sits here, -1 for other tokens
    position_ids: torch.Tensor  # [B, L]
    attention: torch.Tensor  # [B, L, L] bool
    group_slots: torch.Tensor  # [B, G, k*n] token index of each group's EPTs
    group_valid: torch.Tensor  # [B, G] bool
    teacher_ids: torch.Tensor  # [B, G, k, K]
    teacher_logp: torch.Tensor  # [B, G, k, K]
    teacher_rest: torch.Tensor  # [B, G, k]
    target_valid: torch.Tensor  # [B, G, k] bool: a teacher distribution exists at t+i
    next_tokens: torch.Tensor  # [B, G, k] the actual token at t+i+1 (hard labels)

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        return additive_mask(self.attention, dtype)

    def to(self, device: torch.device) -> "TrainBatch":
        """The batch on `device`, the base model's (a GPU's, models/device_plan.py): itself where it already is."""
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})

    @property
    def supervised(self) -> int:
        return int(self.target_valid.sum())


def eligible_insertions(seq: ShardSequence) -> list[int]:
    """Insertion points t whose distance-1 target (the teacher at t+1) exists."""
    return [p - 1 for p in seq.positions.tolist() if p >= 1]


def draw_points(seqs: list[ShardSequence], groups: int, rng: random.Random) -> list[list[int]]:
    return [draw_insertion_points(eligible_insertions(seq), groups, rng) for seq in seqs]


def collate(seqs: list[ShardSequence], k: int, n: int, groups: int, mask: MaskKind, rng: random.Random) -> TrainBatch:
    """A batch with up to `groups` insertion points per sequence drawn from `rng`."""
    return collate_at(seqs, k, n, mask, draw_points(seqs, groups, rng))


def collate_at(seqs: list[ShardSequence], k: int, n: int, mask: MaskKind, points: list[list[int]]) -> TrainBatch:
    """A batch with the given insertion points (points[b] for sequence b)."""
    kn = k * n
    ordinary_len = max(len(seq.input_ids) for seq in seqs)
    layouts = [build_layout(len(seq.input_ids), chosen, k, n, mask, groups_start=ordinary_len)
               for seq, chosen in zip(seqs, points)]
    b, g_max = len(seqs), max(1, max(len(p) for p in points))
    l_max = max(len(lay.position_ids) for lay in layouts)
    top_k = seqs[0].topk_ids.shape[-1]
    input_ids = torch.zeros(b, l_max, dtype=torch.long)
    ept_slot = torch.full((b, l_max), -1, dtype=torch.long)
    position_ids = torch.zeros(b, l_max, dtype=torch.long)
    attention = torch.eye(l_max, dtype=torch.bool).repeat(b, 1, 1)  # padding attends to itself only
    group_slots = torch.zeros(b, g_max, kn, dtype=torch.long)
    group_valid = torch.zeros(b, g_max, dtype=torch.bool)
    teacher_ids = torch.zeros(b, g_max, k, top_k, dtype=torch.long)
    teacher_logp = torch.zeros(b, g_max, k, top_k)
    teacher_rest = torch.zeros(b, g_max, k)
    target_valid = torch.zeros(b, g_max, k, dtype=torch.bool)
    next_tokens = torch.zeros(b, g_max, k, dtype=torch.long)
    for i, (seq, lay, chosen) in enumerate(zip(seqs, layouts, points)):
        t_len, length = len(seq.input_ids), len(lay.position_ids)
        input_ids[i, :t_len] = seq.input_ids
        position_ids[i, :length] = lay.position_ids
        attention[i, :length, :length] = lay.allowed
        entry = {p: e for e, p in enumerate(seq.positions.tolist())}
        for g, t in enumerate(chosen):
            group_slots[i, g] = lay.group_slots[g]
            ept_slot[i, lay.group_slots[g]] = torch.arange(kn)
            group_valid[i, g] = True
            for d in range(k):
                e = entry.get(t + 1 + d)
                if e is None or t + 2 + d >= t_len:
                    continue
                target_valid[i, g, d] = True
                teacher_ids[i, g, d] = seq.topk_ids[e]
                teacher_logp[i, g, d] = seq.topk_logprobs[e]
                teacher_rest[i, g, d] = seq.rest_mass[e]
                next_tokens[i, g, d] = seq.input_ids[t + 2 + d]
    return TrainBatch(ordinary_len, input_ids, ept_slot, position_ids, attention, group_slots, group_valid, teacher_ids,
                      teacher_logp, teacher_rest, target_valid, next_tokens)
