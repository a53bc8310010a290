"""Decoding with draft heads over the base model's features (feature-head, medusa; models/draft_heads.py).

A step: the heads read f, the final hidden state of the token verified last, and draft a static tree
(calibrated: which guess ranks to try at which depth) under the root, the base model's token after f. The
feature head walks the tree level by level, each node's state from its parent's state and its own token;
Medusa's heads guess every depth from f at once. One forward of the base model verifies the tree
(runtime/acceptance.py); the kept path's cache entries stay, and the deepest kept node's hidden state is
the next step's f. The heads only choose which tokens are verified, so the output is the base model's own
whatever they hold (greedy: identical to `ar`; sampled: its distribution).
"""

import time
from dataclasses import dataclass

import torch

from ppdkit.models.draft_heads import draft_logits, feature_step, medusa_states

from ..forward.kv_cache import KVCache
from ..forward.linear import draft_blocks, draft_layers
from ..trees.tree import TreeState
from ..trees.tree_layout import TreeLayout, layout_tree
from ..trees.tree_sizer import TreeSizer
from .drafter import Drafter, Proposal, Verified


@dataclass
class DraftHeadSet:
    kind: str  # "feature" | "medusa"
    tensors: tuple[torch.Tensor, ...]  # models/draft_heads.py TENSORS[kind], in the model's dtype
    vocab: torch.Tensor  # [V'] the draft vocabulary's token ids
    vocab_rows: torch.Tensor  # [V', H] the base model's LM-head rows of those ids
    depth: int  # distances the heads guess
    matrices: torch.dtype | str | None = None  # QUANTIZED: the readout and feature matrices in Q8_0 blocks on a CPU

    def __post_init__(self):
        # a level multiplies a few rows by each matrix: the packed few-rows kernels read each weight once for
        # them, where the default matmul spends more (docs/history.md); Medusa's [D, H, H] stack stays one einsum
        linear = draft_layers(draft_blocks(self.matrices, self.vocab_rows.device))
        self.readout = linear(self.vocab_rows)
        self.layers = tuple(linear(t) for t in self.tensors) if self.kind == "feature" else self.tensors


@dataclass(frozen=True)
class Level:
    """One depth of a draft tree: its nodes that have children, and those children."""

    expanders: torch.Tensor  # [m] node ids at this depth with children (the root alone at depth 0)
    children: torch.Tensor  # [c] node ids one deeper
    child_parent: torch.Tensor  # [c] index of each child's parent in `expanders`
    child_rank: torch.Tensor  # [c] which guess of its parent's it is
    ranks: int  # guesses read per expander
    next_expanders: torch.Tensor  # [m'] indices into `children` of the next level's expanders


@dataclass(frozen=True)
class HeadTree:
    layout: TreeLayout
    levels: tuple[Level, ...]


def head_tree(parents: list[int], depths: list[int], ranks: list[int]) -> HeadTree:
    """The layout (node tokens only, no extra rows) and the drafting plan of a calibrated head tree."""
    state = TreeState(tuple(parents), tuple(depths), tuple(ranks), (0,) * len(parents))
    has_children = {p for p in parents if p >= 0}
    levels, expanders = [], [0]
    while expanders:
        position = {node: i for i, node in enumerate(expanders)}
        children = [c for c in range(1, len(parents)) if parents[c] in position]
        if not children:  # a tree of the root alone (heads that were never right): no drafting
            break
        nxt = [i for i, c in enumerate(children) if c in has_children]
        levels.append(Level(torch.tensor(expanders), torch.tensor(children),
                            torch.tensor([position[parents[c]] for c in children]),
                            torch.tensor([ranks[c] for c in children]), 1 + max(ranks[c] for c in children),
                            torch.tensor(nxt, dtype=torch.long)))
        expanders = [children[i] for i in nxt]
    return HeadTree(layout_tree(state, 1, "ensemble"), tuple(levels))


def draft(model, heads: DraftHeadSet, tree: HeadTree, feature: torch.Tensor, root: int) -> torch.Tensor:
    """feature [H] (the hidden state that chose `root`) -> the tree's node tokens [N], node 0 the root."""
    tokens = torch.full((tree.layout.nodes,), root, dtype=torch.long)
    if not tree.levels:
        return tokens
    if heads.kind == "medusa":
        top = draft_logits(medusa_states(feature, *heads.layers), heads.readout)  # [D, V']
        top = top.topk(max(level.ranks for level in tree.levels), dim=-1).indices  # [D, R]
        tokens[1:] = heads.vocab[top[tree.layout.depths[1:] - 1, tree.layout.ranks[1:]]]
        return tokens
    state = feature_step(feature[None], model.embed_ids(torch.tensor([root])), *heads.layers)  # [1, H]
    for level in tree.levels:
        top = draft_logits(state, heads.readout).topk(level.ranks, dim=-1).indices  # [m, ranks]
        guessed = heads.vocab[top[level.child_parent, level.child_rank]]  # [c]
        tokens[level.children] = guessed
        if len(level.next_expanders):
            chosen = level.next_expanders
            state = feature_step(state[level.child_parent[chosen]], model.embed_ids(guessed[chosen]),
                                 *heads.layers)  # [m', H]
    return tokens


def draft_seconds(model, heads: DraftHeadSet, tree: HeadTree, repeats: int = 7) -> float:
    """Median seconds to draft `tree` from a random feature: a larger tree's cost besides its rows (the
    profile adds it when it chooses the size)."""
    feature, times = torch.randn(model.hidden, dtype=model.dtype, device=model.device), []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            started = time.perf_counter()
            int(draft(model, heads, tree, feature, 0)[-1])  # read back: on a GPU drafting has then finished
            times.append(time.perf_counter() - started)
    times = sorted(times[1:])  # the first call warms caches
    return times[len(times) // 2]


class HeadsDrafter(Drafter):
    """The heads' calibrated tree (the decoder's one size, or `sizer`'s choice each step) drafted from the final
    hidden state of the token verified last; `prune` drops nodes after the early head's layer
    (runtime/trees/pruning.py)."""

    def __init__(self, decoder, cache: KVCache, sizer: TreeSizer | None = None, prune: bool = False):
        super().__init__(decoder, cache)
        self.parts = decoder.draft  # a HeadParts (runtime/drafters/draft_parts.py)
        self.sizer, self.early, self.feature = sizer, self.parts.early_head if prune else None, None

    def prompt_read(self, ids: torch.Tensor, hidden: torch.Tensor, states: torch.Tensor | None) -> None:
        self.feature = hidden[-1]

    def propose(self, root: int) -> Proposal:
        tree = self.parts.head_tree if self.sizer is None else self.parts.trees[self.sizer.size]
        return Proposal(draft(self.model, self.parts.heads, tree, self.feature, root), tree.layout)  # [N]

    def accept(self, proposal: Proposal, verified: Verified) -> None:
        self.feature = verified.hidden[verified.final]
        if self.sizer is not None:  # the draft's time counts: it is part of what a larger tree costs
            self.sizer.observe(proposal.layout.size, sum(verified.seconds.values()), len(verified.path))
