"""ProPD's early pruning (papers/004 section 4.1) in a tree step: the first n decoder layers run on the whole
tree, an early prediction head (trainer/early_run.py) reads every node's residual stream there, and a node
whose token is not among its parent's top-K early guesses is dropped with its descendants; the remaining
layers run on the survivors only. The dropped rows' keys and values of the first n layers are discarded
(the survivors' are moved to the front, so every layer holds the same rows), on the native per-step call
and the PyTorch layers alike. Pruning only removes guesses, and pruned nodes are never kept by the
acceptance rule, so the output stays the base model's own.
"""

from dataclasses import dataclass

import torch

from ppdkit.models.artifact import ArtifactError, Component
from ppdkit.models.draft_heads import draft_logits
from ppdkit.models.heads import apply_residual_head

from .kv_cache import KVCache
from .llama import LeanLlama
from .tree_layout import TreeLayout


@dataclass
class EarlyHead:
    weight: torch.Tensor  # [H, H]
    bias: torch.Tensor  # [H]
    vocab: torch.Tensor  # [V'] the draft vocabulary's token ids
    vocab_rows: torch.Tensor  # [V', H] the base model's LM-head rows of those ids
    layer: int  # n: decoder layers before the head
    top_k: int  # K: a child survives when its token is among its parent's top-K early guesses


def load_early_head(component: Component, model, top_k: int) -> EarlyHead:
    """An early-head component (train.method early-head) for `model` (transformers), shapes checked."""
    hidden, layers = model.config.hidden_size, model.config.num_hidden_layers
    layer = component.hyperparameters.get("early_layer")
    tensors = component.tensors
    shapes = {name: tuple(tensors[name].shape) if name in tensors else None
              for name in ("early_weight", "early_bias", "draft_vocab")}
    if component.method != "early-head" or not isinstance(layer, int) or not 1 <= layer < layers \
            or shapes["early_weight"] != (hidden, hidden) or shapes["early_bias"] != (hidden,) \
            or shapes["draft_vocab"] is None:
        raise ArtifactError(f"{component.path} is not an early-head component for this base model (method "
                            f"{component.method!r}, early_layer {layer!r} of 1..{layers - 1}, tensors {shapes}): "
                            "train one with train.method=early-head")
    if not 1 <= top_k <= shapes["draft_vocab"][0]:
        raise ValueError(f"prune_top_k must be 1..{shapes['draft_vocab'][0]} (the draft vocabulary), not {top_k}")
    dtype = next(model.parameters()).dtype
    vocab = tensors["draft_vocab"].long()
    rows = model.get_output_embeddings().weight.detach()[vocab].to(dtype)
    return EarlyHead(tensors["early_weight"].to(dtype), tensors["early_bias"].to(dtype), vocab, rows, layer, top_k)


def survivors(model: LeanLlama, early: EarlyHead, residual: torch.Tensor, tokens: torch.Tensor,
              layout: TreeLayout) -> torch.Tensor:
    """residual [N, H] of the tree's nodes after early.layer layers, tokens [N] -> alive [N] bool: the root,
    and every node whose path's tokens are each within their parent's top-K early guesses."""
    state = model.final_norm(apply_residual_head(residual, early.weight, early.bias))  # [N, H]
    guesses = early.vocab[draft_logits(state, early.vocab_rows).topk(early.top_k, dim=-1).indices]  # [N, K]
    parents = torch.tensor(layout.links.parents[1:], dtype=torch.long)
    ok = torch.ones(layout.nodes, dtype=torch.bool)
    ok[1:] = (guesses[parents] == tokens[1:, None]).any(-1)
    ancestors = layout.mask[:layout.nodes, :layout.nodes]  # [N, N] row: the node's path, itself included
    return ~(ancestors & ~ok[None, :]).any(-1)


def pruned_forward(model: LeanLlama, cache: KVCache, layout: TreeLayout, tokens: torch.Tensor,
                   early: EarlyHead) -> tuple[torch.Tensor, torch.Tensor]:
    """The tree of node tokens [N] (a layout without extra rows) through every layer, the nodes outside the
    early guesses dropped after layer n: (final hidden states of the survivors [S, H], their node ids [S]).
    The cache then holds the survivors' rows, in this order, after the committed ones."""
    length = cache.length
    mask = torch.cat([torch.ones(layout.size, length, dtype=torch.bool), layout.mask], dim=1)  # [N, length + N]
    positions = length + layout.offsets
    residual = model.forward_layers(model.embed_ids(tokens), positions, cache, mask, 0, early.layer)  # [N, H]
    keep = survivors(model, early, residual, tokens, layout).nonzero()[:, 0]  # [S]
    cache.keep_written(keep, 0, early.layer)
    columns = torch.cat([torch.arange(length), length + keep])
    rest = model.forward_layers(residual[keep], positions[keep], cache, mask[keep][:, columns], early.layer,
                                len(model.layers))
    return model.final_norm(rest), keep
