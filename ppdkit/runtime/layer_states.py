"""The base model's residual stream after chosen decoder layers, read in the same forward: the forward run in
segments that stop there (LeanLlama.forward_layers), so its arithmetic is the plain forward's. EAGLE-3's draft reads
these states while decoding (the verification captures them) and while training (trainer/features.py)."""

import torch

from .kv_cache import KVCache
from .llama import LeanLlama


def forward_with_states(model: LeanLlama, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                        mask: torch.Tensor | None, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """model.forward's final hidden states [T, H], and the residual stream after each of `layers` decoder
    layers, concatenated [T, len(layers) H]: the forward run in segments that stop there."""
    x, states = states_after(model, x, positions, cache, mask, layers)
    if max(layers) < len(model.layers):
        x = model.forward_layers(x, positions, cache, mask, max(layers), len(model.layers))
    return model.final_norm(x), states


def states_after(model: LeanLlama, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                 mask: torch.Tensor | None, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward up to the last of `layers` only -> (the residual stream there [T, H], the states after each of
    `layers` concatenated [T, len(layers) H]): what training reads of the base (trainer/features.py), without the
    layers above."""
    states, start = {}, 0
    for stop in sorted(set(layers)):
        x = model.forward_layers(x, positions, cache, mask, start, stop)
        states[stop], start = x, stop
    return x, torch.cat([states[k] for k in layers], dim=-1)
