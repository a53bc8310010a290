"""One verification forward of a tree of guesses whose nodes carry no prompt tokens (draft heads, n-gram
chains): every node read in one forward over the committed cache, the longest verified path kept."""

import torch

from .acceptance import Sampling, choose
from .kv_cache import KVCache
from .llama import LeanLlama
from .tree_layout import TreeLayout


def verify_tree(model: LeanLlama, cache: KVCache, layout: TreeLayout, tokens: torch.Tensor, sampling: Sampling,
                generator: torch.Generator | None) -> tuple[torch.Tensor, int, torch.Tensor]:
    """tokens [N] (node 0 the root) -> (the deepest kept node's final hidden state [H], the next token, the
    kept path's nodes [P]); the path's cache entries are committed, the others' discarded."""
    hidden = model.forward(model.embed_ids(tokens), cache.length + layout.offsets, cache,
                           layout.mask_after(cache.length))  # [N, H]
    final, next_token = choose(tokens, model.logits(hidden), layout.links, sampling, generator)
    path = layout.paths[final]
    cache.commit(path, layout.size)
    return hidden[final], next_token, path
