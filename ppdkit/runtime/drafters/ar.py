"""Plain decoding on the lean forward, one token per step: the baseline every drafter is judged against."""

import torch

from ..forward.kv_cache import KVCache
from ..trees.tree_layout import shape_layout
from .drafter import Drafter, Proposal


class PlainDrafter(Drafter):
    """Proposes nothing: each step verifies the root alone, so one forward gives one token."""

    def __init__(self, decoder, cache: KVCache):
        super().__init__(decoder, cache)
        self.root_alone = shape_layout((-1,), (-1,))

    def propose(self, root: int) -> Proposal:
        return Proposal(torch.tensor([root]), self.root_alone)
