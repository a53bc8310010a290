"""What prompt-token methods train, as one module: prompt tokens, and optionally a custom decoding head."""

from typing import NamedTuple

import torch
from torch import nn

from .decoding_head import ResidualHead
from .prompt_tokens import PromptTokens


class Drafts(NamedTuple):
    embeddings: torch.Tensor  # [k*n, H]
    ept_weights: torch.Tensor | None  # [k, n]
    head: tuple[torch.Tensor, torch.Tensor] | None  # custom decoding head (weight [H, H], bias [H]), when in use


class PromptDrafts(nn.Module):
    """Prompt tokens, and for ept-head a custom decoding head (zero at start: the identity)."""

    def __init__(self, prompt: PromptTokens, head: ResidualHead | None):
        super().__init__()
        self.prompt, self.head = prompt, head

    def forward(self, use_head: bool = True) -> Drafts:
        embeddings, weights = self.prompt()
        return Drafts(embeddings, weights, self.head() if self.head is not None and use_head else None)
