"""Plain decoding on the lean forward, one token per step: the baseline every drafter is judged against."""

from collections.abc import Callable

import torch

from .acceptance import Sampling, pick
from .kv_cache import KVCache


def read_prompt(model, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """ar's prefill: the prompt ids [P] into an empty cache, causal -> final hidden states [P, H]. Batched
    decoding (runtime/batch.py _prefill) reads each prompt the same way, after the positions it reuses, so its
    answers start from exactly ar's cache."""
    return model.forward(model.embed_ids(ids), torch.arange(len(ids)), cache, None)


def decode_ar(decoder, ids: torch.Tensor, cache: KVCache, emit: Callable[[list[int]], bool], sampling: Sampling,
              generator: torch.Generator | None, sizer=None) -> None:
    """Read the prompt ids [P], then one token per forward until `emit` says stop (no tree: `sizer` is None)."""
    model = decoder.model
    hidden = read_prompt(model, ids, cache)
    cache.commit(None, len(ids))
    token = pick(model.logits(hidden[-1]), sampling, generator)
    done = emit([token])
    while not done:
        hidden = model.forward(model.embed_ids(torch.tensor([token])), torch.tensor([cache.length]), cache, None)
        cache.commit(None, 1)
        token = pick(model.logits(hidden[-1]), sampling, generator)
        done = emit([token], rows=1)
