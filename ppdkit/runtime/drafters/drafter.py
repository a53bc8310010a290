"""What every decoding method is to the one loop (runtime/loop.py): a drafter. It reads the prompt, proposes a tree
of guesses under the root from what it knows of the verified text, and takes the verified path back. The
verification itself is one function for every method (`verify`): one forward of the base model over the step's
rows, the acceptance rule on the tree's nodes, the kept path committed. Two pieces compose into it: a drafter's
extra rows (PPD's prompt-token slots, Self-Draft's branches, read by the same LM-head call as the nodes) and
ProPD's early pruning (runtime/trees/pruning.py), which drops nodes after an early layer.

Whatever a drafter proposes, only guesses equal to the base model's own choice are kept (runtime/acceptance.py),
so every method's greedy output is `ar`'s, and its sampled output has the base model's distribution.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..acceptance import Sampling, choose, pick
from ..forward.kv_cache import KVCache
from ..forward.layer_states import forward_with_states
from ..forward.llama import LeanLlama
from ..trees.pruning import EarlyHead, kept_path, logit_owners, pruned_forward
from ..trees.tree_layout import TreeLayout, mask_after


@dataclass
class Proposal:
    """A step's tree: its node tokens [N] (node 0 the root, the token decoded last) laid out by `layout`, and any
    rows the drafter adds after the nodes (T rows in all)."""

    tokens: torch.Tensor  # [N]
    layout: TreeLayout  # the nodes' paths and links; its offsets [T] and mask [T, T] unless given below
    inputs: torch.Tensor | None = None  # [T, H] the rows' embeddings; None: the nodes' tokens embedded
    offsets: torch.Tensor | None = None  # [T] positions after the root's; None: layout.offsets
    mask: torch.Tensor | None = None  # [T, T] bool; None: layout.mask
    extra_readout: Callable[[torch.Tensor], torch.Tensor] | None = None  # hidden [T, H] -> more rows [E, H] for the
    # same LM-head call (under pruning: one per prompt token of each node, as pruning.logit_owners counts them)
    parts: dict[str, float] = field(default_factory=dict)  # the drafting's seconds by part, where its drafter times it

    @property
    def rows(self) -> int:
        return len(self.offsets) if self.offsets is not None else self.layout.size


@dataclass
class Verified:
    """What one verification kept: the path's nodes [P] (root .. deepest kept node), the base model's token after
    it, and the forward's results that drafters read back."""

    path: torch.Tensor  # [P] node indices
    next_token: int
    accepted: list[int]  # the kept guesses' tokens (the path's after the root)
    hidden: torch.Tensor  # [T, H] final hidden states (zero on rows pruned away)
    logits: torch.Tensor  # [N + E, V] the nodes', then the extra readout's rows
    states: torch.Tensor | None = None  # [T, len(capture) H] the residual stream after the captured layers
    pruned: int = 0  # rows early pruning dropped
    seconds: dict[str, float] = field(default_factory=dict)  # "draft" (and "draft.PART"), "verify": the loop's

    @property
    def final(self) -> int:
        return int(self.path[-1])


class Drafter(ABC):
    """The protocol, with the defaults most drafters share: the prompt read as `ar` reads it, and nothing learned
    from a verification. `capture` names decoder layers whose residual streams the verification returns
    (EAGLE-3's draft reads them); `early` prunes each tree after its layer (the *-prune methods)."""

    capture: tuple[int, ...] = ()
    early: EarlyHead | None = None

    def __init__(self, decoder, cache: KVCache):
        self.decoder, self.model, self.cache = decoder, decoder.model, cache

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Read the prompt ids [P] into the cache -> the logits [V] that choose the first new token."""
        hidden, states = _forward(self.model, self.model.embed_ids(ids), torch.arange(len(ids)), self.cache, None,
                                  self.capture)
        self.cache.commit(None, len(ids))
        self.prompt_read(ids, hidden, states)
        return self.model.logits(hidden[-1])

    def prompt_read(self, ids: torch.Tensor, hidden: torch.Tensor, states: torch.Tensor | None) -> None:
        """The prompt's final hidden states [P, H] (and its captured states), for a drafter that drafts from them."""

    @abstractmethod
    def propose(self, root: int) -> Proposal:
        """The tree to verify under `root` (the token decoded last, not yet in the cache)."""

    def accept(self, proposal: Proposal, verified: Verified) -> None:
        """The verification's outcome, for the next proposal."""


def _forward(model: LeanLlama, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, mask: torch.Tensor | None,
             capture: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward -> (final hidden states [T, H], the residual stream after the `capture` layers [T, len H], None
    without any)."""
    if capture:
        return forward_with_states(model, x, positions, cache, mask, capture)
    return model.forward(x, positions, cache, mask), None


def read_prompt(model: LeanLlama, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The prompt ids [P] into an empty cache, causal -> final hidden states [P, H] (not committed). Batched decoding
    (batching/batched_decoding.py) and the teacher pass read prompts the same way, so their states are `ar`'s."""
    return model.forward(model.embed_ids(ids), torch.arange(len(ids)), cache, None)


def verify(model: LeanLlama, cache: KVCache, proposal: Proposal, sampling: Sampling,
           generator: torch.Generator | None, capture: tuple[int, ...] = (), early: EarlyHead | None = None
           ) -> Verified:
    """One forward over the proposal's rows after the committed cache -> what it kept; the kept path's cache entries
    are committed, every other row's discarded."""
    layout, tokens = proposal.layout, proposal.tokens
    if proposal.rows == 1:  # the root alone: `ar`'s step, token for token
        return _one_token(model, cache, tokens, layout.paths[0], sampling, generator, capture)
    x = model.embed_ids(tokens) if proposal.inputs is None else proposal.inputs  # [T, H]
    offsets = layout.offsets if proposal.offsets is None else proposal.offsets
    tree_mask = layout.mask if proposal.mask is None else proposal.mask
    positions, rows = cache.length + offsets, len(offsets)
    mask = mask_after(tree_mask, cache.length)  # [T, length + T]
    states, keep, alive = None, None, None
    if early is not None:  # ProPD: the nodes outside the early guesses leave after its layer, with their rows
        hidden, keep, alive = pruned_forward(model, cache, x, positions, mask, layout, tokens, early)
    else:
        hidden, states = _forward(model, x, positions, cache, mask, capture)  # [T, H]
    extra = proposal.extra_readout(hidden) if proposal.extra_readout is not None else None
    read = hidden[:layout.nodes] if extra is None else torch.cat([hidden[:layout.nodes], extra])  # [N + E, H]
    if alive is None:  # one LM-head call for every row read: it reads its weights once however many rows
        logits = model.logits(read)
    else:  # the survivors' rows only: a pruned node is never kept, so its rows are never read
        live = alive[logit_owners(layout)].nonzero()[:, 0]
        logits = read.new_zeros(len(read), model.vocab_size)
        logits[live] = model.logits(read[live])
    final, next_token = choose(tokens, logits[:layout.nodes], layout.links, sampling, generator, alive)
    path = layout.paths[final]
    if keep is None:
        cache.commit(path, rows)
    else:
        cache.commit(kept_path(path, keep, rows), len(keep))
    return Verified(path, next_token, tokens[path[1:]].tolist(), hidden, logits, states,
                    0 if keep is None else rows - len(keep))


def _one_token(model: LeanLlama, cache: KVCache, tokens: torch.Tensor, path: torch.Tensor, sampling: Sampling,
               generator: torch.Generator | None, capture: tuple[int, ...]) -> Verified:
    """A step of the root alone (path: [0]): causal over the cache, its token picked from its own logits."""
    hidden, states = _forward(model, model.embed_ids(tokens), torch.tensor([cache.length]), cache, None, capture)
    cache.commit(None, 1)
    logits = model.logits(hidden[-1])  # [V]
    return Verified(path, pick(logits, sampling, generator), [], hidden, logits[None], states)
