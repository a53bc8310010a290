"""Draft heads: small trained maps applied to hidden states before the base model's own LM head.

`ResidualHead` is PPD's custom decoding head (PPD thesis section 4.4.2) in the residual form Medusa uses:
    head(h) = h + SiLU(h W^T + b)        h [..., H], W [H, H], b [H]
followed by the base model's frozen LM head. W and b start at zero, so an untrained head is exactly the
identity and PPD with it starts as PPD without it; 2-stage training (prompt tokens first, then both)
therefore begins from the prompt tokens' own accuracy. The thesis's LM2 is a whole second vocabulary
projection (V x H = 28M numbers for SmolLM2, more than the 576-wide prompt tokens it serves by far);
the residual form trains H^2 + H = 0.33M and keeps one LM head in memory and in every decoding step.
"""

import torch
from torch import nn

HEAD_TENSORS = ("head_weight", "head_bias")  # their names in a component's weights.safetensors


def apply_residual_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """hidden [..., H], weight [H, H], bias [H] -> [..., H]."""
    return hidden + nn.functional.silu(nn.functional.linear(hidden, weight.to(hidden.dtype), bias.to(hidden.dtype)))


class ResidualHead(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size, hidden_size))  # [H, H]
        self.bias = nn.Parameter(torch.zeros(hidden_size))  # [H]

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights themselves (applied by `apply_residual_head`): an engine that gathers partitioned
        parameters around forward (DeepSpeed ZeRO-3) hands out whole tensors."""
        return self.weight, self.bias
