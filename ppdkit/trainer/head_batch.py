"""Batches for draft heads over the base model's features: teacher-cache sequences -> draft paths.

A draft path starts at a position t of a sequence: the head reads f_t (the base model's final hidden state
there) and the tokens x_{t+1} .. x_{t+D}; at depth j it guesses token t+j+1, whose teacher distribution is
the cache's entry at position t+j, and (feature head) regresses f_{t+j}.
"""

import random
from dataclasses import dataclass

import torch

from ppdkit.data_pipeline.teacher_cache import ShardSequence

from .insertion import draw_insertion_points


@dataclass
class HeadBatch:
    start: torch.Tensor  # [N, H] f_t, where each path starts
    path_tokens: torch.Tensor  # [N, D] x_{t+1} .. x_{t+D} (0 past the end)
    features: torch.Tensor  # [N, D, H] f_{t+1} .. f_{t+D}, the feature head's regression targets
    next_tokens: torch.Tensor  # [N, D] x_{t+2} .. x_{t+D+1}, the text's token each depth guesses (hard labels)
    teacher_index: torch.Tensor  # [N, D, K] the teacher's top-K at t+j as draft-vocabulary indices, -1 outside it
    teacher_probs: torch.Tensor  # [N, D, K] their probabilities
    teacher_top1: torch.Tensor  # [N, D] the teacher's most likely token (draft-vocabulary index, -1 outside it)
    valid: torch.Tensor  # [N, D] bool: token t+j+1 exists and the teacher has a distribution for it

    @property
    def supervised(self) -> int:
        return int(self.valid.sum())


def path_starts(seq: ShardSequence, groups: int, rng: random.Random) -> list[int]:
    """Up to `groups` starts t whose depth-1 target (the teacher at t+1) exists."""
    return draw_insertion_points([p - 1 for p in seq.positions.tolist() if p >= 1], groups, rng)


def head_batch(seqs: list[ShardSequence], features: list[torch.Tensor], depth: int, vocab_index: torch.Tensor,
               starts: list[list[int]]) -> HeadBatch:
    """Paths from starts[b] in sequence b, whose base-model features are features[b] [T_b, H];
    vocab_index [V] maps a token id to its draft-vocabulary index (-1 outside)."""
    rows = [(b, t) for b, chosen in enumerate(starts) for t in chosen]
    n, h, top_k = len(rows), features[0].shape[-1], seqs[0].topk_ids.shape[-1]
    start = torch.zeros(n, h)
    path_tokens = torch.zeros(n, depth + 1, dtype=torch.long)  # x_{t+1} .. x_{t+D+1}
    targets = torch.zeros(n, depth, h)
    teacher_ids = torch.zeros(n, depth, top_k, dtype=torch.long)
    teacher_logp = torch.full((n, depth, top_k), -float("inf"))
    valid = torch.zeros(n, depth, dtype=torch.bool)
    entries = [{p: e for e, p in enumerate(seq.positions.tolist())} for seq in seqs]
    for i, (b, t) in enumerate(rows):
        seq, f = seqs[b], features[b]
        length = len(seq.input_ids)
        start[i] = f[t]
        for j in range(1, depth + 1):
            if t + j >= length:
                break
            path_tokens[i, j - 1] = seq.input_ids[t + j]
            targets[i, j - 1] = f[t + j]
            e = entries[b].get(t + j)
            if e is not None and t + j + 1 < length:
                path_tokens[i, j] = seq.input_ids[t + j + 1]
                valid[i, j - 1] = True
                teacher_ids[i, j - 1] = seq.topk_ids[e]
                teacher_logp[i, j - 1] = seq.topk_logprobs[e]
    index = vocab_index[teacher_ids]  # [N, D, K]
    probs = torch.where(index >= 0, teacher_logp.exp(), torch.zeros(()))
    kept = probs.sum(-1)  # [N, D] the teacher's mass inside the draft vocabulary (within its top-K)
    return HeadBatch(start, path_tokens[:, :depth], targets, path_tokens[:, 1:], index, probs / kept.clamp_min(1e-12)[..., None], index[..., 0],
                     valid & (kept > 0))
