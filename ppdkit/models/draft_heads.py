"""Draft heads over the base model's features: guesses from the last verified hidden state, no extra rows.

Two kinds, trained on the frozen base model's own final hidden states f (after its final norm, what its LM
head reads) and read out through the base model's frozen LM-head rows of a reduced draft vocabulary
(the most frequent tokens of the training text): V' = 4096 rows cost 1/12 of SmolLM2's 49152-row LM head
per guess, and a guess outside V' could rarely have been accepted anyway.

feature  ppdkit's head (the EAGLE / Hydra family, attention-free): a state that walks the draft path.
         s_0 = f_t (the hidden state of the last verified token t, whose LM head gave token t+1), then
             s_j = u + W_down SiLU(W_up u),  u = W_in [s_{j-1}; e(x_{t+j})]      (x: the token at depth j-1)
         s_j regresses f_{t+j} and its logits E' s_j guess token t+j+1. Each guess sees the path that leads
         to it (Medusa's heads cannot: they guess every distance from f_t alone), at the cost of one small
         MLP per tree level, and with no attention there is no draft KV cache to keep in step.
medusa   Medusa-1's heads (the baseline): head d reads f_t alone, h_d = f_t + SiLU(W_d f_t + b_d), and guesses
         token t+1+d. Medusa trains a vocabulary projection per head; here every head shares E', so the
         comparison is between the ways the state is formed, not the readout.
"""

from collections.abc import Callable

import torch
from torch import nn

HEAD_KINDS = ("feature", "medusa")
# their tensors in a component's weights.safetensors, besides draft_vocab [V'] (int64 token ids)
FEATURE_TENSORS = ("feature_in", "feature_up", "feature_down")  # [H, 2H], [I, H], [H, I]
MEDUSA_TENSORS = ("medusa_weight", "medusa_bias")  # [D, H, H], [D, H]
TENSORS = {"feature": FEATURE_TENSORS, "medusa": MEDUSA_TENSORS}


# a weight [out, in], or a layer computing x W^T with it (the decoder's packed few-rows kernels,
# runtime/forward/linear.py: drafting multiplies a handful of rows by these weights, where reading them is the cost)
Weight = torch.Tensor | Callable[[torch.Tensor], torch.Tensor]


def apply_linear(x: torch.Tensor, weight: Weight) -> torch.Tensor:
    return nn.functional.linear(x, weight) if isinstance(weight, torch.Tensor) else weight(x)


def feature_step(state: torch.Tensor, token_embedding: torch.Tensor, w_in: Weight, w_up: Weight,
                 w_down: Weight) -> torch.Tensor:
    """One level of the feature head: state [..., H], token_embedding [..., H] -> next state [..., H]."""
    u = apply_linear(torch.cat([state, token_embedding], dim=-1), w_in)  # [..., H]
    return u + apply_linear(nn.functional.silu(apply_linear(u, w_up)), w_down)


def medusa_states(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Medusa heads: hidden [..., H], weight [D, H, H], bias [D, H] -> [..., D, H], head d's state."""
    projected = torch.einsum("...h,dgh->...dg", hidden, weight) + bias  # [..., D, H]
    return hidden[..., None, :] + nn.functional.silu(projected)


def draft_logits(state: torch.Tensor, vocab_rows: Weight) -> torch.Tensor:
    """state [..., H], vocab_rows [V', H] (the base model's LM-head rows of the draft vocabulary) -> [..., V']."""
    return apply_linear(state, vocab_rows)


def inverse_index(ids: torch.Tensor, size: int) -> torch.Tensor:
    """ids [K] distinct values in 0..size-1 -> [size]: the position of each value in ids, -1 for the others
    (a token id's index in the draft vocabulary; an input row's index among the rows kept)."""
    index = torch.full((size,), -1, dtype=torch.long)
    index[ids] = torch.arange(len(ids))
    return index


def frequent_tokens(sequences: list[torch.Tensor], size: int, vocab_size: int,
                    besides: torch.Tensor | None = None) -> torch.Tensor:
    """The draft vocabulary: the `size` most frequent token ids of `sequences` (1-D id tensors), ascending ids,
    leaving out the ids `besides` holds (a vocabulary being grown). Ties and unseen tokens fill up by id, so the
    choice is deterministic."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for ids in sequences:
        counts += torch.bincount(ids.long(), minlength=vocab_size).double()
    taken = 0
    if besides is not None:
        counts[besides.long()] = -1.0  # below every count: ranked last, then cut off
        taken = len(besides.unique())
    order = torch.sort(-counts, stable=True).indices  # by count, then by id
    return order[:min(size, vocab_size - taken)].sort().values


class DraftHeads(nn.Module):
    """The trainable part of feature-head and medusa training; forward() hands out every trainable tensor
    (an engine that gathers partitioned parameters around forward, DeepSpeed ZeRO-3, sees whole tensors)."""

    def __init__(self, kind: str, hidden_size: int, depth: int, inner: int, seed: int = 0):
        super().__init__()
        if kind not in HEAD_KINDS:
            raise ValueError(f"unknown draft head kind {kind!r}; use one of {HEAD_KINDS}")
        self.kind, self.depth = kind, depth
        gen = torch.Generator().manual_seed(seed)
        h = hidden_size
        if kind == "feature":
            # W_in starts as [I | 0] plus noise: s_1 starts near f_t, a state the frozen readout understands
            w_in = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1) + torch.randn(h, 2 * h, generator=gen) * 0.01
            self.feature_in = nn.Parameter(w_in)  # [H, 2H]
            self.feature_up = nn.Parameter(torch.randn(inner, h, generator=gen) / h ** 0.5)  # [I, H]
            self.feature_down = nn.Parameter(torch.zeros(h, inner))  # [H, I]: the MLP starts silent
        else:  # zero: every head starts as the identity, Medusa's initialisation
            self.medusa_weight = nn.Parameter(torch.zeros(depth, h, h))  # [D, H, H]
            self.medusa_bias = nn.Parameter(torch.zeros(depth, h))  # [D, H]

    def forward(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, name) for name in TENSORS[self.kind])


def path_states(kind: str, tensors: tuple[torch.Tensor, ...], start: torch.Tensor, path_tokens: torch.Tensor,
                embed: torch.Tensor) -> torch.Tensor:
    """The head's state at every depth of given paths: start [N, H] (f_t), path_tokens [N, D] (x_{t+1} ..
    x_{t+D}), embed [V, H] the base model's input embeddings -> [N, D, H]; depth j's state guesses token t+j+1."""
    if kind == "medusa":
        return medusa_states(start, *tensors)
    states, state = [], start
    for j in range(path_tokens.shape[1]):
        state = feature_step(state, embed[path_tokens[:, j]], *tensors)  # [N, H]
        states.append(state)
    return torch.stack(states, dim=1)
