"""The base model's residual stream after chosen decoder layers, read in the same forward: the forward run in
segments that stop there (LeanLlama.layer_runner: the rows prepared once, then one call per segment), so its
arithmetic is the plain forward's. EAGLE-3's draft reads these states while decoding (the verification captures
them) and while training (trainer/features.py)."""

from collections.abc import Callable

import torch

from .kv_cache import KVCache
from .llama import LeanLlama


def forward_with_states(model: LeanLlama, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                        mask: torch.Tensor | None, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """model.forward's final hidden states [T, H], and the residual stream after each of `layers` decoder
    layers, concatenated [T, len(layers) H]: read in the native layers' one call where they run the step whole
    (LeanLlama.layer_runner's `with_states`), else the forward run in segments that stop there."""
    run = model.layer_runner(x.shape[0], positions, cache, mask)
    with_states = getattr(run, "with_states", None)
    if with_states is not None:
        hidden, states = with_states(x, layers)
        return model.final_norm(hidden), states
    return run_with_states(run, model, x, layers)


def run_with_states(run: Callable[[torch.Tensor, int, int], torch.Tensor], model: LeanLlama, x: torch.Tensor,
                    layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """forward_with_states for any way of running layers start .. stop - 1 (`run(x, start, stop)`: one sequence's
    layer_runner, several sequences' forward_windows) -> final hidden states [T, H], the states [T, len(layers) H]."""
    x, states = _segments(run, x, layers)
    if max(layers) < len(model.layers):
        x = run(x, max(layers), len(model.layers))
    return model.final_norm(x), states


def states_after(model: LeanLlama, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                 mask: torch.Tensor | None, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward up to the last of `layers` only -> (the residual stream there [T, H], the states after each of
    `layers` concatenated [T, len(layers) H]): what training reads of the base (trainer/features.py), without the
    layers above."""
    return _segments(model.layer_runner(x.shape[0], positions, cache, mask), x, layers)


def _segments(run: Callable[[torch.Tensor, int, int], torch.Tensor], x: torch.Tensor,
              layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    states, start = {}, 0
    for stop in sorted(set(layers)):
        x = run(x, start, stop)
        states[stop], start = x, stop
    return x, torch.cat([states[k] for k in layers], dim=-1)
