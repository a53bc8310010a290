"""Prompt tokens with ensemble prompt tokens (EPT): the trainable part of PPD (PPD thesis ch. 4).

k prompt tokens, each backed by n EPT embeddings. At a given token distance i, the guess is the
aggregate of the logits of prompt token i's n EPTs: their mean (section 4.3), or learned scalar
weights (section 4.4.4). The three attention masks among EPTs are those of section 4.4.3.
"""

from typing import Literal

import torch
from torch import nn

MaskKind = Literal["ensemble", "decoder", "encoder"]
Aggregation = Literal["mean", "learned"]


class PromptTokens(nn.Module):
    def __init__(self, num_prompt_tokens: int, num_epts: int, hidden_size: int,
                 aggregation: Aggregation = "mean", init: torch.Tensor | None = None):
        super().__init__()
        self.k, self.n = num_prompt_tokens, num_epts
        self.aggregation = aggregation
        self.embeddings = nn.Parameter(torch.zeros(num_prompt_tokens, num_epts, hidden_size))  # [k, n, H]
        if init is not None:
            self.embeddings.data.copy_(init.reshape(num_prompt_tokens, num_epts, hidden_size))
        if aggregation == "learned":
            self.ept_weights = nn.Parameter(torch.full((num_prompt_tokens, num_epts), 1.0 / num_epts))  # [k, n]
        elif aggregation != "mean":
            raise ValueError(f"unknown EPT aggregation {aggregation!r}; use 'mean' or 'learned'")

    def forward(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(embeddings in layout order, distance-major then EPT: [k*n, H]; EPT weights [k, n] or None).

        Everything trainable comes out of forward(), so an engine that gathers partitioned parameters
        only around forward (DeepSpeed ZeRO-3) hands out whole tensors.
        """
        weights = self.ept_weights if self.aggregation == "learned" else None
        return self.embeddings.reshape(self.k * self.n, -1), weights


def aggregate_epts(x: torch.Tensor, k: int, n: int, weights: torch.Tensor | None) -> torch.Tensor:
    """[..., k*n, D] per-EPT values -> [..., k, D] per prompt token: the mean, or the learned weighted sum.

    Aggregation is linear and so is the LM head, so aggregating hidden states before the head gives
    exactly the aggregated logits at a fraction of the cost (k*V instead of k*n*V outputs).
    """
    per_ept = x.unflatten(-2, (k, n))  # [..., k, n, D]
    if weights is None:
        return per_ept.mean(-2)
    return (per_ept * weights[..., None].to(per_ept.dtype)).sum(-2)


def init_from_token_embeddings(embedding: nn.Embedding, k: int, n: int, token_ids: list[int] | None = None,
                               seed: int = 0) -> torch.Tensor:
    """[k, n, H] copies of ordinary token embeddings (section 6.1.2): given ids, else a seeded random draw."""
    weight = embedding.weight.detach()
    if token_ids is None:
        gen = torch.Generator().manual_seed(seed)
        token_ids = torch.randint(0, weight.shape[0], (k * n,), generator=gen).tolist()
    if len(token_ids) != k * n:
        raise ValueError(f"{len(token_ids)} init token ids for {k} prompt tokens x {n} EPTs")
    return weight[torch.tensor(token_ids)].float().reshape(k, n, -1).clone()


def ept_mask(k: int, n: int, kind: MaskKind) -> torch.Tensor:
    """[k*n, k*n] bool: may EPT row attend to EPT column? Index (i, j) -> i*n + j (distance i, EPT j).

    ensemble: only its own group j (the j-th EPT of every prompt token), at distances up to its own;
    decoder:  every EPT at or before it in the layout (a triangle, like a decoder layer);
    encoder:  every EPT of its own prompt token and of the prompt tokens before it.
    """
    idx = torch.arange(k * n)
    dist, ept = idx // n, idx % n
    if kind == "ensemble":
        return (ept[:, None] == ept[None, :]) & (dist[None, :] <= dist[:, None])
    if kind == "decoder":
        return idx[None, :] <= idx[:, None]
    if kind == "encoder":
        return dist[None, :] <= dist[:, None]
    raise ValueError(f"unknown EPT mask {kind!r}; use ensemble, decoder or encoder")
