"""Held-out accuracy of prompt tokens by token distance (the format of the PPD thesis's table 6.4).

The target at distance i after insertion point t is the base model's own greedy token there (the
teacher's top-1 at t+i): what a lossless greedy decoder has to guess.
"""

import random

import torch

from ppdkit.data_pipeline.teacher_cache import ShardSequence

from .prompt_batch import collate
from .losses import kl_to_compressed_teacher, soft_cross_entropy, topk_hits
from .student import student_logprobs

TOPS = (1, 5, 10)


def evaluate(base_model, embeddings: torch.Tensor, ept_weights: torch.Tensor | None, k: int, n: int, mask: str,
             sequences: list[ShardSequence], groups: int, micro_batch: int, seed: int = 1234,
             head: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, float]:
    """{'acc_top1_d1': ..., 'kl_d1': ..., 'acc_top1_mean': ...} over fixed insertion points of `sequences`."""
    rng = random.Random(seed)  # the same points at every evaluation, so evaluations compare
    device = base_model.device  # a GPU's, or the CPU (models/device_plan.py)
    hits = {top: torch.zeros(k, device=device) for top in TOPS}
    kl_sum, count = torch.zeros(k, device=device), torch.zeros(k, device=device)
    with torch.no_grad():
        for i in range(0, len(sequences), micro_batch):
            batch = collate(sequences[i:i + micro_batch], k, n, groups, mask, rng).to(device)
            logp = student_logprobs(base_model, embeddings, ept_weights, k, n, batch, head).flatten(0, 1)  # [N, k, V]
            valid = batch.target_valid.flatten(0, 1)  # [N, k]
            teacher_top1 = batch.teacher_ids.flatten(0, 1)[..., 0]  # [N, k]
            for top, hit in topk_hits(logp, teacher_top1, TOPS).items():
                hits[top] += (hit & valid).sum(0)
            kl = kl_to_compressed_teacher(logp, batch.teacher_ids.flatten(0, 1), batch.teacher_logp.flatten(0, 1),
                                          batch.teacher_rest.flatten(0, 1))
            kl_sum += (kl * valid).sum(0)
            count += valid.sum(0)
    return by_distance(hits, {"kl": kl_sum}, count)


def by_distance(hits: dict[int, torch.Tensor], sums: dict[str, torch.Tensor], count: torch.Tensor) -> dict[str, float]:
    """Per-distance figures from counts over k distances: hits {top: [k]} -> acc_top{top}_d{i} and their mean
    over distances, sums {name: [k]} -> {name}_d{i} means, count [k] positions scored at each distance."""
    k = len(count)
    out: dict[str, float] = {}
    for d in range(k):
        for top, hit in hits.items():
            out[f"acc_top{top}_d{d + 1}"] = (hit[d] / count[d].clamp_min(1)).item()
        for name, total in sums.items():
            out[f"{name}_d{d + 1}"] = (total[d] / count[d].clamp_min(1)).item()
    for top in hits:
        out[f"acc_top{top}_mean"] = sum(out[f"acc_top{top}_d{d + 1}"] for d in range(k)) / k
    out["eval_positions"] = count.sum().item()
    return out


class DraftVocabTally:
    """Held-out figures of a one-distance draft over a draft vocabulary, summed over micro-batches: top-K hits
    of the teacher's most likely token (outside the draft vocabulary: a miss) and the soft cross-entropy."""

    def __init__(self, tops: tuple[int, ...]):
        self.hits = {top: torch.zeros(1) for top in tops}
        self.loss, self.count = torch.zeros(1), torch.zeros(1)

    def add(self, logp: torch.Tensor, index: torch.Tensor, probs: torch.Tensor, valid: torch.Tensor) -> None:
        """logp [N, 1, V'], index and probs [N, 1, K] (losses.on_draft_vocab's), valid [N, 1]."""
        # summed on the CPU: a GPU's batch sends one number of each
        for top, hit in topk_hits(logp, index[..., 0], tuple(self.hits)).items():
            self.hits[top] += (hit & valid).sum(0).cpu()
        self.loss += (soft_cross_entropy(logp, index, probs) * valid).sum(0).cpu()
        self.count += valid.sum(0).cpu()

    def figures(self) -> dict[str, float]:
        return by_distance(self.hits, {"loss": self.loss}, self.count)
