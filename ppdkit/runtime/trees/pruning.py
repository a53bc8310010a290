"""ProPD's early pruning (ProPD paper section 4.1) in a tree step: the first n decoder layers run on the whole
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
from ppdkit.models.component_hyperparameters import read_hyperparameters
from ppdkit.models.draft_heads import draft_logits, inverse_index
from ppdkit.models.decoding_head import apply_residual_head

from ..forward.kv_cache import KVCache
from ..forward.linear import Linear
from ..forward.llama import LeanLlama
from ..forward.precision import activation_dtype
from .tree_layout import TreeLayout


@dataclass
class EarlyHead:
    weight: torch.Tensor  # [H, H]
    bias: torch.Tensor  # [H]
    vocab: torch.Tensor  # [V'] the draft vocabulary's token ids
    vocab_rows: torch.Tensor  # [V', H] the base model's LM-head rows of those ids
    layer: int  # n: decoder layers before the head
    top_k: int  # K: a child survives when its token is among its parent's top-K early guesses

    def __post_init__(self):
        self.readout = Linear(self.vocab_rows)  # the packed few-rows kernel (runtime/forward/linear.py)


def load_early_head(component: Component, model, top_k: int) -> EarlyHead:
    """An early-head component (train.method early-head) for `model` (transformers), shapes checked."""
    hidden, layers = model.config.hidden_size, model.config.num_hidden_layers
    # another kind of component: refused below in one message with what was found
    layer = read_hyperparameters(component).early_layer if component.method == "early-head" else None
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
    dtype, device = activation_dtype(next(model.parameters()).dtype), model.device  # the decoder's activations
    vocab = tensors["draft_vocab"].long().to(device)
    rows = model.get_output_embeddings().weight.detach()[vocab].to(dtype)
    return EarlyHead(tensors["early_weight"].to(device, dtype), tensors["early_bias"].to(device, dtype), vocab, rows,
                     layer, top_k)


def survivors(model: LeanLlama, early: EarlyHead, residual: torch.Tensor, tokens: torch.Tensor,
              layout: TreeLayout) -> torch.Tensor:
    """residual [N, H] of the tree's nodes after early.layer layers, tokens [N] -> alive [N] bool: the root,
    and every node whose path's tokens are each within their parent's top-K early guesses."""
    parents = torch.tensor(layout.links.parents[1:], dtype=torch.long)  # [N-1]
    expanders, child_of = parents.unique(return_inverse=True)  # the nodes with children: only theirs are read
    state = model.final_norm(apply_residual_head(residual[expanders], early.weight, early.bias))  # [E, H]
    guesses = early.vocab[draft_logits(state, early.readout).topk(early.top_k, dim=-1).indices]  # [E, K]
    ok = torch.ones(layout.nodes, dtype=torch.bool)
    ok[1:] = (guesses[child_of] == tokens[1:, None]).any(-1)
    ancestors = layout.mask[:layout.nodes, :layout.nodes]  # [N, N] row: the node's path, itself included
    return ~(ancestors & ~ok[None, :]).any(-1)


def row_owners(layout: TreeLayout) -> torch.Tensor:
    """[T]: the node each input row belongs to (a node's own row, or one of its prompt-token slots)."""
    slots = layout.size - layout.nodes
    epts = slots // max(sum(layout.prompts), 1)
    per_node = torch.tensor(layout.prompts, dtype=torch.long) * epts  # [N] slot rows of each node
    return torch.cat([torch.arange(layout.nodes), torch.repeat_interleave(torch.arange(layout.nodes), per_node)])


def logit_owners(layout: TreeLayout) -> torch.Tensor:
    """[N + sum of prompts]: the node each LM-head row belongs to (its own row, or one of its aggregated
    prompt tokens: TreeLayout.guess_rows, node-major)."""
    nodes = torch.arange(layout.nodes)
    return torch.cat([nodes, torch.repeat_interleave(nodes, torch.tensor(layout.prompts, dtype=torch.long))])


def pruned_forward(model: LeanLlama, cache: KVCache, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                   layout: TreeLayout, tokens: torch.Tensor, early: EarlyHead
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tree step's rows x [T, H] (nodes first, then any prompt-token slots) through every layer, the nodes
    outside the early guesses dropped after layer n with their slots: (final hidden states [T, H], zero on
    dropped rows; the kept rows [S]; alive [N] per node). The cache then holds the kept rows, in order,
    after the committed ones, in every layer."""
    residual = model.forward_layers(x, positions, cache, mask, 0, early.layer)  # [T, H]
    alive = survivors(model, early, residual[:layout.nodes], tokens, layout)  # [N]
    keep = alive[row_owners(layout)].nonzero()[:, 0]  # [S]
    cache.keep_written(keep, 0, early.layer)
    columns = torch.cat([torch.arange(cache.length), cache.length + keep])
    rest = model.forward_layers(residual[keep], positions[keep], cache, mask[keep][:, columns], early.layer,
                                len(model.layers))
    hidden = torch.zeros_like(residual)
    hidden[keep] = model.final_norm(rest)
    return hidden, keep, alive


def kept_path(path: torch.Tensor, keep: torch.Tensor, rows: int) -> torch.Tensor:
    """The kept path's input rows [P] -> their rows among the kept ones (what KVCache.commit takes)."""
    return inverse_index(keep, rows)[path]
