"""Calibration: how often each guess rank at each distance is right, on held-out data; trees from that.

The target is what the decoder will verify against: the base model's own greedy token, computed by
the same model the decoder runs (the unquantized base), at every position of the held-out text. For a
dynamic tree, the rate at distance d is measured where every nearer distance was guessed within the
ranks kept (a guess at distance d is only verified when its ancestors were accepted).
"""

import random
from pathlib import Path

import torch
from tqdm import tqdm

from ppdkit.data_pipeline.teacher_cache import TeacherCache
from ppdkit.models.artifact import read_component
from ppdkit.models.heads import HEAD_TENSORS
from ppdkit.models.loading import load_base_model
from ppdkit.runtime.tree import best_tree_for_size

from .batch import collate
from .student import student_forward


def guess_ranks(base_model, component, sequences, groups: int, micro_batch: int, seed: int = 0) -> torch.Tensor:
    """[N, k]: rank of the base model's greedy token among the prompt tokens' guesses (0 = top-1)."""
    h = component.hyperparameters
    k, n = h["num_prompt_tokens"], h["num_epts"]
    emb = component.tensors["prompt_embeddings"].reshape(k * n, -1).to(base_model.dtype)
    weights = component.tensors.get("ept_weights")
    draft_head = None  # a custom decoding head is what the component's guesses go through (ppd-head)
    if HEAD_TENSORS[0] in component.tensors:
        draft_head = tuple(component.tensors[name].to(base_model.dtype) for name in HEAD_TENSORS)
    lm_head = base_model.get_output_embeddings()
    rng = random.Random(seed)
    out = []
    with torch.no_grad():
        for i in tqdm(range(0, len(sequences), micro_batch), desc="calibrating", unit="batch"):
            batch = collate(sequences[i:i + micro_batch], k, n, groups, h["mask"], rng)
            logp, hidden = student_forward(base_model, emb, weights, k, n, batch, draft_head)  # [B,G,k,V], [B,T,H]
            # greedy token of the base at t + d (ordinary positions are untouched by prompt tokens)
            insert_at = batch.position_ids.gather(1, batch.group_slots[..., 0]) - 1  # [B, G]
            at = insert_at[..., None] + torch.arange(1, k + 1)  # [B, G, k]
            rows = torch.arange(len(at))[:, None, None]
            greedy = lm_head(hidden[rows, at.clamp(max=hidden.shape[1] - 1)]).argmax(-1)  # [B, G, k]
            target_logp = logp.gather(-1, greedy[..., None])  # [B, G, k, 1]
            rank = (logp > target_logp).sum(-1)  # [B, G, k]
            valid = batch.group_valid[..., None] & batch.target_valid  # [B, G, k]
            out.append(torch.where(valid, rank, torch.full_like(rank, -1)).flatten(0, 1))
    return torch.cat(out)


def acceptance_table(ranks: torch.Tensor, max_rank: int) -> list[list[float]]:
    """p[d][r] = P(greedy token is guess r at distance d+1 | every nearer distance hit within max_rank)."""
    k = ranks.shape[1]
    table = []
    alive = torch.ones(len(ranks), dtype=torch.bool)
    for d in range(k):
        valid = alive & (ranks[:, d] >= 0)
        count = int(valid.sum())
        table.append([(int(((ranks[:, d] == r) & valid).sum()) / count) if count else 0.0 for r in range(max_rank)])
        alive = valid & (ranks[:, d] < max_rank)
    return table


def calibrate(base_name: str, component_dir: Path, teacher_dir: Path, sizes: list[int], max_rank: int,
              max_sequences: int, groups: int, micro_batch: int, dtype: str = "float32") -> dict:
    base = load_base_model(base_name, quantization="none", dtype=dtype)
    component = read_component(component_dir, expect_fingerprint=base.fingerprint)
    cache = TeacherCache(teacher_dir)
    split = "holdout" if cache.shards("holdout") else "train"
    sequences = [s for s in cache.sequences(split) if len(s.positions) > 1][:max_sequences]
    ranks = guess_ranks(base.model, component, sequences, groups, micro_batch)
    table = acceptance_table(ranks, max_rank)
    n = component.hyperparameters["num_epts"]
    trees = {str(size): best_tree_for_size(table, size, n).to_json() for size in sizes}
    return {"split": split, "sequences": len(sequences), "insertions": len(ranks), "max_rank": max_rank,
            "acceptance": table, "trees": trees}
