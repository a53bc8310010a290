"""Decoding with EAGLE-3's draft (models/eagle3.py): a tree grown each step from the draft's confidence
(EAGLE-2/3's dynamic tree, runtime/trees/grown_tree.py's loop and sizing), optionally merged with ANPD's n-gram chain.

The draft keeps its own KV cache (one layer) in step with the verified text. After each verification the kept
path's positions are read into it: row t holds the base's fused hidden states at t and the token at t+1 (the
last one: the base model's next token, the next tree's root), at rotary position t, causal over what it
holds. The last row's output h drafts the root's children. Growing the tree adds draft rows after the
committed ones, one per expanded node, each seeing the committed rows, its ancestors' rows and itself; once the
tree is chosen those rows are dropped (the cache rolls back to its committed length), so a rejected branch
leaves nothing behind, and the next verification's rows overwrite the space. The base model's hidden states
come from the verification forward itself, run in segments that stop at the draft's layers
(LeanLlama.layer_runner): the same arithmetic, so the output stays the base model's own.
"""

import math
from dataclasses import dataclass, field

import torch

from ppdkit.models.eagle3 import layer_input, layer_output, readout

from ..forward.kv_cache import KVCache
from ..forward.linear import SKINNY_MAX_ROWS, Linear
from ..forward.llama import LeanLlama, attention_bias, rotate
from ..trees.grown_tree import ROOT, GrownDrafter, Proposals, StepCost, grow_level, level_top
from ..trees.tree_values import PROBABILITY_BOUNDS
from .drafter import Proposal, Verified


@dataclass
class Eagle3Set:
    """A loaded draft: norms as tensors in the activations' dtype, matrices as the runtime's few-rows layers in the
    base's weight dtype."""

    weights: dict[str, torch.Tensor | Linear]  # models/eagle3.py's names (q, k and v also fused, as "qkv")
    vocab: torch.Tensor  # [V'] the draft vocabulary's token ids
    layers: tuple[int, ...]  # the base's hidden states it fuses (hidden_states indices)
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    # the layer in one native call (runtime/kernels/decoder_layers.cpp eagle3_layer) where the CPU kernels run its
    # matrices: its norms and packed panels, and {Hq, Hkv, D, I, H}; empty: the PyTorch operations below
    native_weights: list[torch.Tensor] = field(default_factory=list)
    native_shape: list[int] = field(default_factory=list)
    # the draft's prompt tokens (models/eagle3.py PARALLEL): embeddings [P, H] and hidden states [P, H], or None
    parallel: tuple[torch.Tensor, torch.Tensor] | None = None

    def new_cache(self, capacity: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        return KVCache(1, self.kv_heads, self.head_dim, capacity, dtype, device)


def draft_rows(model: LeanLlama, draft: Eagle3Set, cache: KVCache, hidden: torch.Tensor, tokens: torch.Tensor | None,
               positions: torch.Tensor, visible: torch.Tensor, embeds: torch.Tensor | None = None) -> torch.Tensor:
    """The draft layer on R rows written after `cache`'s committed ones: hidden [R, H] (g, a parent's h or a prompt
    token's), tokens [R] (or embeds [R, H]: their embeddings, prompt tokens' among them), positions [R], visible
    [R, length + R] bool -> h [R, H]."""
    w, r = draft.weights, len(hidden)
    embeds = model.embed_ids(tokens) if embeds is None else embeds
    hq, hkv, d = draft.heads, draft.kv_heads, draft.head_dim
    group = hq // hkv
    bias = attention_bias(visible, cache.length, r, group, model.dtype, model.device)  # [g R, length + R]
    if draft.native_weights and model.native is not None and r <= SKINNY_MAX_ROWS:
        # one call, not ~60 small operations: on a few rows their dispatch costs more than the layer's arithmetic
        # (docs/history.md)
        cache.reserve(r)
        return model.native.eagle3_layer(embeds.contiguous(), hidden.contiguous(), draft.native_weights,
                                         draft.native_shape, draft.eps, model.cos[positions], model.sin[positions],
                                         bias, cache.k, cache.v, cache.length)
    x = layer_input(embeds, hidden, w, draft.eps)  # [R, 2H]
    qkv = w["qkv"](x)  # [R, (Hq + 2 Hkv) D]
    cos, sin = model.cos[positions][:, None], model.sin[positions][:, None]  # [R, 1, D]
    qk = rotate(qkv[:, :(hq + hkv) * d].view(r, hq + hkv, d), cos, sin)
    q = qk[:, :hq].reshape(r, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * r, d)  # [Hkv, g R, D]
    keys, values = cache.write(0, qk[:, hq:].transpose(0, 1), qkv[:, (hq + hkv) * d:].view(r, hkv, d).transpose(0, 1))
    scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=1.0 / math.sqrt(d))  # [Hkv, g R, S]
    attended = torch.bmm(scores.softmax(-1), values).view(hkv, group, r, d).permute(2, 0, 1, 3).reshape(r, hq * d)
    return layer_output(attended, hidden, w, draft.eps)


def reads_out_natively(model: LeanLlama, draft: Eagle3Set) -> bool:
    """Whether the draft's layer and readout run on the CPU kernels: its layer's packed weights, the model's native
    kernels and its LM head's panels (readout_top's path and native_grows's)."""
    head = draft.weights["lm_head.weight"]
    return bool(draft.native_weights) and model.native is not None and head.panels is not None


def readout_top(model: LeanLlama, draft: Eagle3Set, h: torch.Tensor, beam: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's readout of h [m, H] and a tree level's choice (grown_tree.level_top): each row's `beam` likeliest
    draft-vocabulary entries, their log-probabilities [m, b] and indices [m, b]. In one native call where the draft
    layer runs natively: its norm, matmul, log-softmax and top-k are ~10 PyTorch operations on a few rows at every
    level a step drafts, their dispatch costing more than their arithmetic."""
    head = draft.weights["lm_head.weight"]
    if reads_out_natively(model, draft) and h.dtype == torch.float32 and len(h) <= SKINNY_MAX_ROWS:
        values, indices = model.native.eagle3_readout(h, draft.weights["norm.weight"], draft.eps, head.panels,
                                                      head.out_features, beam)
        return values, indices
    return level_top(readout(h, draft.weights, draft.eps), beam)


# False: every tree grown level by level, as where the kernels do not run (docs/tools/draft_blocks.py --compare grow)
NATIVE_GROW = True
# the fitted tree values' weights the native grow reads, in its order (runtime/kernels/eagle3_grow.cpp Weight)
GROW_WEIGHTS = ("bias", "depth", "first_level", "draft", "draft_logit", "draft_and_corpus", "draft_and_chain",
                "corpus_depth", "chain_depth", "parent_draft_logit", "parent_undrafted")


class Eagle3Drafter(GrownDrafter):
    """EAGLE-3's grown tree: its draft cache, and the verified positions waiting to be read into it (their fused
    states and tokens) until the next root is known. The verification captures the base's states at its layers."""

    READS_PROMPTS = False  # Eagle3ParallelDrafter: the draft's prompt tokens are read after the root's row

    def __init__(self, decoder, cache: KVCache, **grown):
        super().__init__(decoder, cache, **grown)
        self.draft = decoder.draft.eagle3
        self.capture = self.draft.layers
        self.prompts: tuple[torch.Tensor, torch.Tensor] | None = self.draft.parallel if self.READS_PROMPTS else None
        # the committed rows, plus one per expanded node while a tree grows (or per prompt token)
        self.draft_cache = self.draft.new_cache(
            cache.capacity + self.beam * self.depth + 1 + (0 if self.prompts is None else len(self.prompts[0])),
            self.model.dtype, self.model.device)
        self.pending_states = self.pending_tokens = None  # [R, 3H], [R]: verified, not yet in the draft cache

    def prompt_read(self, ids: torch.Tensor, hidden: torch.Tensor, states: torch.Tensor | None) -> None:
        super().prompt_read(ids, hidden, states)
        self.pending_states, self.pending_tokens = states, ids

    def accept(self, proposal: Proposal, verified: Verified) -> None:
        super().accept(proposal, verified)
        states, tokens = verified.states[verified.path], proposal.tokens[verified.path]
        if self.pending_states is not None:  # a step that drafted nothing (limit_nodes 1) left its rows unread
            states, tokens = torch.cat([self.pending_states, states]), torch.cat([self.pending_tokens, tokens])
        self.pending_states, self.pending_tokens = states, tokens

    def _read_verified(self, root: int, prompts: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Commit the pending positions' rows (each with the token after it; the last with `root`) -> the last
        row's h [1, H], whose guesses are the root's children. `prompts` (the draft's prompt tokens, embeddings and
        hidden states [P, H]): P rows after them in the same forward, causal, at the next P positions, not committed
        -> [1 + P, H], the root's row then each prompt token's."""
        states, cache = self.pending_states, self.draft_cache
        r, start = len(states), cache.length
        following = torch.cat([self.pending_tokens[1:], torch.tensor([root], device=states.device)])
        g = self.draft.weights["fc.weight"](states.to(self.model.dtype))  # [R, H]
        embeds = self.model.embed_ids(following)  # [R, H]
        if prompts is not None:
            g, embeds = torch.cat([g, prompts[1]]), torch.cat([embeds, prompts[0]])  # [R + P, H]
        rows = len(g)
        visible = torch.ones(rows, start + rows, dtype=torch.bool).tril(diagonal=start)  # causal over the cache
        h = draft_rows(self.model, self.draft, cache, g, None, torch.arange(start, start + rows), visible, embeds)
        cache.commit(None, r)  # the prompt tokens' rows stay uncommitted: the next rows overwrite them
        self.pending_states = self.pending_tokens = None
        return h[r - 1:]

    def grow(self, root: int, wanted: int, cost: StepCost | None = None) -> Proposals:
        """The draft's proposals under `root`, grown as runtime/trees/grown_tree.py's expand grows the feature head's:
        in one native call where the draft's layer and readout run natively, else level by level here."""
        if native_grows(self.model, self.draft, self.beam):
            return self.grow_native(root, wanted, cost)
        return self.grow_levels(self._read_verified(root), wanted, cost)

    def grow_native(self, root: int, wanted: int, cost: StepCost | None) -> Proposals:
        """grow's tree in one call (runtime/kernels/eagle3_grow.cpp, grow_levels's twin), the verified positions read
        into the draft's cache in the same call where they fit one (_read_verified's twin: a step's few rows; a
        prompt's go through _read_verified)."""
        model, draft, cache, prompts = self.model, self.draft, self.draft_cache, self.prompts
        head, fc, values = draft.weights["lm_head.weight"], draft.weights["fc.weight"], self.values
        extra = 0 if prompts is None else len(prompts[0])  # the prompt tokens' rows, read with the verified ones
        read = len(self.pending_states)
        read = read if read + extra <= SKINNY_MAX_ROWS and fc.panels is not None else 0
        if read:
            cache.reserve(read + extra)
            start, fc_panels, tokens = self.pending_states.to(model.dtype), fc.panels, self.pending_tokens
        else:  # [1, H] the root's h (with prompt tokens: [1 + P, H], theirs after it)
            start, fc_panels, tokens = self._read_verified(root, prompts), None, None
        grown = model.native.eagle3_grow(
            start, fc_panels, tokens, root, model.embed, draft.vocab, draft.native_weights, draft.native_shape,
            draft.eps, draft.weights["norm.weight"], head.panels, head.out_features, model.cos, model.sin, cache.k,
            cache.v, cache.length, self.beam, self.depth, wanted,
            [] if values is None else values.weights_named(GROW_WEIGHTS), list(PROBABILITY_BOUNDS),
            [] if cost is None else cost.seconds, cost.ratio if cost else 0.0, cost.overhead if cost else 0.0,
            *(prompts if prompts is not None else (None, None)))
        if read:
            cache.commit(None, read)
            self.pending_states = self.pending_tokens = None
        return Proposals(*(column.tolist() for column in grown))

    def grow_levels(self, state: torch.Tensor, wanted: int, cost: StepCost | None) -> Proposals:
        """grow's tree from the root's h [1, H], a level at a time: the draft's readout, grow_level's choice, the draft
        layer on the chosen children."""
        cache, draft, beam, depth = self.draft_cache, self.draft, self.beam, self.depth
        committed = cache.length  # the verified rows, all kept: the tree's rows go after them
        rows = [[]]  # each expanded node's draft rows along its path (indices after the committed rows)
        frontier, found = ROOT, Proposals()
        for level in range(1, depth + 1):
            top = readout_top(self.model, draft, state, beam)  # [m, b] twice
            grown = grow_level(found, top, frontier, level, draft.vocab, beam, wanted, last=level == depth, cost=cost,
                               worth=self.values)
            if grown is None:
                break
            parents, tokens, frontier = grown
            written = cache.length - committed  # draft rows of earlier levels
            rows = [rows[p] + [written + i] for i, p in enumerate(parents)]
            visible = torch.zeros(len(rows), cache.length + len(rows), dtype=torch.bool)
            visible[:, :committed] = True
            for i, path in enumerate(rows):
                visible[i, [committed + j for j in path]] = True
            position = committed - 1 + level  # the node's parent's row sits one position before it
            state = draft_rows(self.model, draft, cache, state[parents], tokens, torch.full((len(rows),), position),
                               visible)
            cache.commit(None, len(rows))
        cache.rollback(committed)  # the tree's rows are dropped: only verified positions stay
        return found


class Eagle3ParallelDrafter(Eagle3Drafter):
    """EAGLE-3's draft with its prompt tokens (models/eagle3.py PARALLEL; the PPD thesis's synergy, 6.4): the verified
    positions and P prompt-token rows in one draft forward, whose readouts guess every depth at once, given the
    verified text (not the guessed parent, as the sequential draft's do). The tree grows over them as grow_levels
    grows it, each level's children the same depth's likeliest tokens under every expanded node, with no draft forward
    after the first: a step's drafting is one layer call and one readout of 1 + P rows, where grow's is a layer call
    and a readout a level."""

    READS_PROMPTS = True

    def __init__(self, decoder, cache: KVCache, **grown):
        super().__init__(decoder, cache, **grown)
        self.depth = min(self.depth, 1 + len(self.prompts[0]))
        # the fitted tree values (tree_values.json) value a sequential draft's guesses given their parent; these
        # are not, so they are valued by their own probabilities
        self.values = None

    def grow(self, root: int, wanted: int, cost: StepCost | None = None) -> Proposals:
        """In one native call where the draft runs natively (eagle3_grow with the prompt tokens), else here."""
        if native_grows(self.model, self.draft, self.beam):
            return self.grow_native(root, wanted, cost)
        return self.grow_marginals(root, wanted, cost)

    def grow_marginals(self, root: int, wanted: int, cost: StepCost | None = None) -> Proposals:
        """The tree over one draft forward's guesses, level by level (the native call's twin)."""
        h = self._read_verified(root, self.prompts)[:self.depth]  # [D, H]: depth 1, then each prompt token's
        values, indices = readout_top(self.model, self.draft, h, self.beam)  # [D, b] twice
        found, frontier = Proposals(), ROOT
        for level in range(1, len(h) + 1):
            m = len(frontier.values)
            top = values[level - 1].expand(m, -1), indices[level - 1].expand(m, -1)  # the depth's guesses, each parent
            grown = grow_level(found, top, frontier, level, self.draft.vocab, self.beam, wanted, last=level == len(h),
                               cost=cost)
            if grown is None:
                break
            frontier = grown[2]
        return found


def native_grows(model: LeanLlama, draft: Eagle3Set, beam: int) -> bool:
    """Whether a step's tree grows in one native call: the draft's layer and readout run natively (a bfloat16 or GGUF
    decoder on the CPU kernels, float32 activations) and a level's rows fit one call."""
    return NATIVE_GROW and reads_out_natively(model, draft) and model.dtype == torch.float32 and beam <= SKINNY_MAX_ROWS
