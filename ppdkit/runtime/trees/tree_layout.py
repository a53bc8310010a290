"""A tree state laid out as one input sequence: node tokens first, then each node's prompt-token slots.

Built once per state when a decoder loads, so a decoding step only indexes precomputed tensors.
"""

from dataclasses import dataclass
from functools import lru_cache

import torch

from ppdkit.models.prompt_tokens import ept_mask

from ..acceptance import TreeLinks
from ..drafters.lookup import LOOKUP_RANK
from .tree import TreeState


@dataclass(frozen=True)
class TreeLayout:
    nodes: int
    depths: torch.Tensor  # [N]
    ranks: torch.Tensor  # [N]
    offsets: torch.Tensor  # [T] position of each input token relative to the root's
    mask: torch.Tensor  # [T, T] bool: may row attend to column (within the tree)
    slot_embedding: torch.Tensor  # [T - N] which prompt embedding (distance-major, then EPT) fills each slot
    slot_distances: torch.Tensor  # [sum of prompts] the distance index of each node's prompt tokens, node-major
    guess_rows: tuple[torch.Tensor, ...]  # per node: its prompt tokens' rows among [nodes, aggregated slots]
    prompts: tuple[int, ...]
    paths: tuple[torch.Tensor, ...]  # per node: input indices of root .. node
    links: TreeLinks  # parents, depths and children as lists, for the acceptance rules
    lookup: int = 0  # the last `lookup` nodes are lookup chains (runtime/drafters/lookup.py), not guesses

    @property
    def size(self) -> int:
        return len(self.offsets)

    def mask_after(self, length: int) -> torch.Tensor:
        """[T, length + T] bool: every row sees the `length` committed tokens, then the tree's own mask."""
        return mask_after(self.mask, length)


def mask_after(mask: torch.Tensor, length: int) -> torch.Tensor:
    """A step's mask [T, T] -> [T, length + T]: every row also sees the `length` committed tokens."""
    return torch.cat([torch.ones(len(mask), length, dtype=torch.bool), mask], dim=1)


def layout_tree(state: TreeState, epts: int, mask_kind: str) -> TreeLayout:
    n_nodes = len(state.parents)
    paths: list[list[int]] = []
    for node, parent in enumerate(state.parents):
        paths.append([node] if parent < 0 else paths[parent] + [node])
    total = n_nodes + sum(state.prompts) * epts
    mask = torch.zeros(total, total, dtype=torch.bool)
    offsets = torch.zeros(total, dtype=torch.long)
    # the nodes' part in one tensor each, not an indexing per node: grown trees (no prompt tokens) are laid out on
    # most steps, their shapes recurring too seldom for the cache below to hold them all
    seen = [[False] * n_nodes for _ in range(n_nodes)]
    for node, path in enumerate(paths):
        for ancestor in path:
            seen[node][ancestor] = True
    mask[:n_nodes, :n_nodes] = torch.tensor(seen, dtype=torch.bool)
    offsets[:n_nodes] = torch.tensor(state.depths, dtype=torch.long)
    no_rows = torch.zeros(0, dtype=torch.long)  # a node's guess rows without prompt tokens; and the slots' index
    slot_embedding, slot_distances, guess_rows = [no_rows], [], []  # concatenates when no node has prompt tokens
    start = n_nodes
    for node in range(n_nodes):
        c = state.prompts[node]
        if not c:
            guess_rows.append(no_rows)
            continue
        slots = torch.arange(start, start + c * epts)
        mask[slots[:, None], torch.tensor(paths[node])[None, :]] = True  # the node's own path
        mask[slots[:, None], slots[None, :]] = ept_mask(c, epts, mask_kind)  # its prompt tokens, per EPT mask
        offsets[slots] = state.depths[node] + torch.arange(c).repeat_interleave(epts) + 1
        slot_embedding.append(torch.arange(c * epts))  # distance j's EPTs are embeddings j*n .. j*n+n-1
        guess_rows.append(n_nodes + len(slot_distances) + torch.arange(c))
        slot_distances.extend(range(c))
        start += c * epts
    return TreeLayout(n_nodes, torch.tensor(state.depths), torch.tensor(state.ranks), offsets, mask,
                      torch.cat(slot_embedding), torch.tensor(slot_distances), tuple(guess_rows),
                      tuple(state.prompts), tuple(torch.tensor(p) for p in paths),
                      TreeLinks.of(list(state.parents), list(state.depths), list(state.ranks)),
                      sum(r == LOOKUP_RANK for r in state.ranks))


def shape_layout(parents: tuple[int, ...], ranks: tuple[int, ...]) -> TreeLayout:
    """The layout of a tree of node tokens only, no prompt tokens (grown trees, n-gram chains, Self-Draft's
    tries): shapes recur from step to step, so each is built once per device (the default one: the decoder's)."""
    return _shape_layout(parents, ranks, torch.get_default_device())


@lru_cache(maxsize=1024)
def _shape_layout(parents: tuple[int, ...], ranks: tuple[int, ...], device: torch.device) -> TreeLayout:
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return layout_tree(TreeState(parents, tuple(depths), ranks, (0,) * len(parents)), 1, "ensemble")
