"""Parallel prompt decoding: guesses from prompt tokens, verified in the same forward.

One step feeds the tree of the current state: the root (the token decoded last), the guess nodes, and
prompt-token slots behind every node. From one forward:
- the acceptance rule (runtime/acceptance.py) keeps a path of guesses: for greedy decoding, each
  guess that equals the base model's greedy token at its parent (exact match);
- the token after the deepest kept node, chosen by the base model there, is the next root;
- that node's prompt tokens give the next step's guesses, and their count its state.
The KV cache keeps the root and the kept guesses, in order; everything else is dropped in place.
With exact matching every emitted token is the base model's greedy token for exactly the emitted
prefix: lossless.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ppdkit.models.heads import apply_residual_head
from ppdkit.models.prompt_tokens import aggregate_epts, ept_mask

from .acceptance import Sampling, choose, pick
from .kv_cache import KVCache
from .llama import LeanLlama
from .lookup import ContextIndex, draft_chains
from .methods import LOOKUP_LENGTHS
from .pruning import EarlyHead, kept_path, logit_owners, pruned_forward
from .tree_layout import TreeLayout
from .tree_sizer import TreeSizer


@dataclass
class PromptTokenSet:
    embeddings: torch.Tensor  # [k * n, H], distance-major
    weights: torch.Tensor | None  # [k, n] learned EPT weights, or None for the mean
    k: int
    n: int
    mask_kind: str
    head: tuple[torch.Tensor, torch.Tensor] | None = None  # a custom decoding head's (weight [H, H], bias [H])

    def draft_states(self, hidden: torch.Tensor, distances: torch.Tensor | slice) -> torch.Tensor:
        """[S * n, H] hidden states of S prompt tokens' EPT slots at `distances` -> [S, H], the states the LM
        head reads for their guesses: EPTs aggregated, then the custom decoding head if there is one."""
        weights = None if self.weights is None else self.weights[distances]  # [S, n]
        per_token = aggregate_epts(hidden, hidden.shape[0] // self.n, self.n, weights)  # [S, H]
        return per_token if self.head is None else apply_residual_head(per_token, *self.head)


def guesses_from(model: LeanLlama, hidden: torch.Tensor, prompts: PromptTokenSet, count: int, ranks: int) -> torch.Tensor:
    """hidden [count * n, H] of one node's prompt slots -> top-`ranks` guesses per distance [count, ranks]."""
    return model.logits(prompts.draft_states(hidden, slice(0, count))).topk(ranks, dim=-1).indices


def prefill(model: LeanLlama, cache: KVCache, ids: torch.Tensor, prompts: PromptTokenSet, ranks: int,
            sampling: Sampling = Sampling(), generator: torch.Generator | None = None) -> tuple[int, torch.Tensor]:
    """Read the prompt [P] with all k prompt tokens behind its last token: (first token, guesses [k, ranks])."""
    p, kn = len(ids), prompts.k * prompts.n
    mask = torch.zeros(p + kn, p + kn, dtype=torch.bool)
    mask[:p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
    mask[p:, :p] = True
    mask[p:, p:] = ept_mask(prompts.k, prompts.n, prompts.mask_kind)
    mask = torch.cat([torch.ones(p + kn, cache.length, dtype=torch.bool), mask], dim=1)
    positions = torch.cat([torch.arange(p), p - 1 + torch.arange(prompts.k).repeat_interleave(prompts.n) + 1])
    x = torch.cat([model.embed_ids(ids), prompts.embeddings.to(model.dtype)])
    hidden = model.forward(x, cache.length + positions, cache, mask)
    first = pick(model.logits(hidden[p - 1]), sampling, generator)
    guesses = guesses_from(model, hidden[p:], prompts, prompts.k, ranks)
    cache.commit(torch.arange(p), p + kn)
    return first, guesses


@dataclass
class StepResult:
    accepted: list[int]  # verified guess tokens, in order
    next_token: int  # the base model's token after them, greedy or sampled (the next root)
    guesses: torch.Tensor  # [state, ranks] for the next step
    state: int
    pruned: int = 0  # rows early pruning dropped


def ppd_step(model: LeanLlama, cache: KVCache, prompts: PromptTokenSet, tree: TreeLayout, root: int,
             guesses: torch.Tensor, ranks: int, sampling: Sampling = Sampling(),
             generator: torch.Generator | None = None, chain: list[int] = (),
             early: EarlyHead | None = None) -> StepResult:
    """One verify-and-guess forward; `chain` fills the tree's lookup nodes (tree.lookup of them, chain after chain);
    `early` prunes the tree after its layer (runtime/pruning.py)."""
    if len(chain) != tree.lookup:
        raise ValueError(f"the tree has {tree.lookup} lookup nodes, {len(chain)} tokens were given")
    guessed = tree.nodes - tree.lookup
    node_tokens = torch.empty(tree.nodes, dtype=torch.long)
    node_tokens[0] = root
    node_tokens[1:guessed] = guesses[tree.depths[1:guessed] - 1, tree.ranks[1:guessed]]
    node_tokens[guessed:] = torch.tensor(list(chain), dtype=torch.long)
    x = torch.cat([model.embed_ids(node_tokens), prompts.embeddings.to(model.dtype)[tree.slot_embedding]])
    mask = tree.mask_after(cache.length)
    positions = cache.length + tree.offsets
    if early is None:
        hidden, keep, alive = model.forward(x, positions, cache, mask), None, None  # [T, H]
    else:  # dropped rows' hidden states are zero: no kept node's guesses read them
        hidden, keep, alive = pruned_forward(model, cache, x, positions, mask, tree, node_tokens, early)
    # One LM-head call for the nodes and every node's prompt tokens (EPTs aggregated first): the head
    # reads its 28M weights once however many rows it gets.
    slots = prompts.draft_states(hidden[tree.nodes:], tree.slot_distances)  # [sum c, H]
    rows = torch.cat([hidden[:tree.nodes], slots])  # [N + sum c, H]
    if alive is None:
        logits = model.logits(rows)  # [N + sum c, V]
    else:  # the survivors' rows only: a pruned node is never kept, so its rows are never read
        live = alive[logit_owners(tree)].nonzero()[:, 0]
        logits = rows.new_zeros(len(rows), model.vocab_size)
        logits[live] = model.logits(rows[live])
    final, next_token = choose(node_tokens, logits[:tree.nodes], tree.links, sampling, generator, alive)
    path = tree.paths[final]
    new_guesses = logits[tree.guess_rows[final]].topk(ranks, dim=-1).indices  # [count, ranks]
    if keep is None:
        cache.commit(path, tree.size)
    else:
        cache.commit(kept_path(path, keep, tree.size), len(keep))
    return StepResult(node_tokens[path[1:]].tolist(), next_token, new_guesses, tree.prompts[final],
                      0 if keep is None else tree.size - len(keep))


def decode_ppd(decoder, ids: torch.Tensor, cache: KVCache, emit: Callable[[list[int]], bool], sampling: Sampling,
               generator: torch.Generator | None, lookup: bool = False, head: bool = False,
               sizer: TreeSizer | None = None, prune: bool = False) -> None:
    """Decode until `emit` says stop: a prefill, then one tree step after another (`decoder`'s prompt tokens,
    trees by state, lookup layouts). `lookup` adds the context's (and table's) chains under each root;
    `head` reads the guesses through the component's custom decoding head, otherwise the base LM head alone;
    `sizer` picks each step's tree size (runtime/tree_sizer.py), otherwise the decoder's one tree; `prune` drops
    nodes (and their prompt tokens) after the early head's layer (runtime/pruning.py)."""
    prompts = decoder.prompts if head else replace(decoder.prompts, head=None)
    root, guesses = prefill(decoder.model, cache, ids, prompts, decoder.ranks, sampling, generator)
    state = prompts.k
    done = emit([root])
    context = ContextIndex(ids.tolist() + [root]) if lookup else None
    level = 0  # index into LOOKUP_LENGTHS
    while not done:
        size = None if sizer is None else sizer.size
        layout, chain = (decoder.layouts if size is None else decoder.size_layouts[size])[state], []
        if context is not None:
            length = LOOKUP_LENGTHS[level]
            chains = draft_chains(context, decoder.ngrams, 1 if level else decoder.lookup_chains, length)
            if chains:
                layout = decoder.lookup_layout(state, len(chains), length, size)
                chain = [t for c in chains for t in c]
        started = time.perf_counter()
        step = ppd_step(decoder.model, cache, prompts, layout, root, guesses, decoder.ranks, sampling, generator,
                        chain, decoder.early_head if prune else None)
        if prune:
            decoder.pruned_rows.append(step.pruned)
        if sizer is not None:
            sizer.observe(layout.size, time.perf_counter() - started, len(step.accepted) + 1)
        whole_chain = bool(chain) and step.state == 0 and len(step.accepted) == length
        level = min(level + 1, len(LOOKUP_LENGTHS) - 1) if whole_chain else 0
        done = emit(step.accepted + [step.next_token], rows=layout.size)
        if context is not None:
            context.extend(step.accepted + [step.next_token])
        root, guesses, state = step.next_token, step.guesses, step.state
