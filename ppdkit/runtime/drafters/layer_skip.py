"""Self-speculative decoding (Draft & Verify): the base model with some attention and MLP
sub-layers skipped drafts a chain token by token, and the whole model verifies it in one forward.

The draft shares the base model's weights and KV cache. Its kept attention sub-layers read the committed
keys/values (the whole model's, of verified tokens) and write the drafted tokens' entries after them;
a skipped attention sub-layer writes nothing there. Once the chain is drafted the cache is rolled back to
the committed length, and the verification forward writes every layer's keys/values of the root and the
drafted tokens over those positions, so the draft's partial entries never outlive their step and the
kept path's entries are exactly the whole model's.

A fine-tuned draft (train.method skip-finetune, the D&V paper's appendix F; `--method skip-ft`) skips more
sub-layers and brings its own RMSNorm weights and a head over a draft vocabulary (the base model's LM-head rows of the
tokens it guesses among); its matmuls are still the base model's, so it costs no memory beyond ~2 L H floats,
and it reads the committed keys/values exactly as it was trained to (trainer/skip_finetune_run.py).

Adaptive draft-exiting (section 3.4): drafting stops when the draft's probability of its own guess falls
below a threshold gamma, and gamma follows the acceptance rate of each drafting stage (equations 2-4,
defaults of table 6). Drafts are the draft's greedy tokens: greedy output is the base model's own, and
sampled output keeps the base model's distribution (runtime/acceptance.py).
"""

from dataclasses import dataclass

import torch

from ..forward.kv_cache import KVCache
from ..forward.linear import Linear
from ..forward.llama import SKIP_ATTENTION, SKIP_MLP, LeanLlama
from .anpd import chain_layout
from .drafter import Drafter, Proposal, Verified

MAX_DRAFT = 12  # K, table 6


@dataclass
class DraftExit:
    """The adaptive threshold of equations 2-4: AR <- b1 AR + (1 - b1) AR_e; gamma~ = gamma + eps if AR <= alpha,
    else gamma - eps; gamma <- b2 gamma + (1 - b2) gamma~. Defaults: table 6 (MT-Bench, LLaMA-2-13B-Chat)."""

    gamma: float = 0.6  # gamma_0
    alpha: float = 0.85
    epsilon: float = 0.01
    beta1: float = 0.5
    beta2: float = 0.9
    acceptance: float | None = None  # AR; the paper leaves its start open: the first stage's own rate

    def update(self, stage_acceptance: float) -> None:
        """After a drafting stage whose drafted tokens were accepted at rate `stage_acceptance` (AR_e)."""
        b1 = self.beta1 if self.acceptance is not None else 0.0
        self.acceptance = b1 * (self.acceptance or 0.0) + (1 - b1) * stage_acceptance  # (2)
        target = self.gamma + self.epsilon if self.acceptance <= self.alpha else self.gamma - self.epsilon  # (3)
        self.gamma = self.beta2 * self.gamma + (1 - self.beta2) * target  # (4)


def check_skip_map(skip: tuple[int, ...], layers: int) -> tuple[int, ...]:
    """A skip map: one mask per decoder layer, each 0..3 (SKIP_ATTENTION | SKIP_MLP bits)."""
    skip = tuple(int(s) for s in skip)
    if len(skip) != layers or any(not 0 <= s <= SKIP_ATTENTION | SKIP_MLP for s in skip):
        raise ValueError(f"a skip map holds one value per decoder layer ({layers}), each 0 (keep), 1 (skip the "
                         f"attention), 2 (skip the MLP) or 3 (skip both); got {list(skip)}")
    return skip


@dataclass(frozen=True)
class SkipDraft:
    """What drafts: `model` (the base model, or its view with a fine-tuned draft's norms) run with `skip`, read by
    `head` over `vocab` (token ids [V']; None: the whole vocabulary)."""

    skip: tuple[int, ...]
    model: LeanLlama
    head: Linear  # H -> V' (or V)
    vocab: torch.Tensor | None = None

    @classmethod
    def of_base(cls, model: LeanLlama, skip: tuple[int, ...]) -> "SkipDraft":
        """Draft & Verify's draft: the base model itself with sub-layers skipped."""
        return cls(skip, model, model.head)

    @classmethod
    def fine_tuned(cls, model: LeanLlama, lm_head: torch.Tensor, skip: tuple[int, ...], ln1: torch.Tensor,
                   ln2: torch.Tensor, norm: torch.Tensor, vocab: torch.Tensor) -> "SkipDraft":
        """A skip-finetune component's draft: its norms ln1, ln2 [L, H] and norm [H] on `model`'s matmuls, its
        head the rows of `lm_head` [V, H] of its draft vocabulary `vocab` [V']."""
        return cls(skip, model.with_norms(ln1, ln2, norm), Linear(lm_head[vocab].to(model.dtype).contiguous()), vocab)

    def guess(self, hidden: torch.Tensor) -> tuple[float, int]:
        """hidden [H] after the final norm -> (the draft's probability of its guess, the guessed token id)."""
        confidence, index = torch.softmax(self.head(hidden).float(), -1).max(-1)
        return float(confidence), int(index) if self.vocab is None else int(self.vocab[index])


def draft_chain(draft: SkipDraft, cache: KVCache, root: int, gamma: float, limit: int) -> list[int]:
    """1 to `limit` tokens after `root` from the skipping draft, ending with the first guess whose draft
    probability is below `gamma` (kept: one more verified row costs little, and every stage then measures
    an acceptance rate for the threshold's rule). The cache is left at its committed length."""
    model, committed, chain, token = draft.model, cache.length, [], root
    while len(chain) < limit:
        hidden = model.forward(model.embed_ids(torch.tensor([token])), torch.tensor([cache.length]), cache, None,
                               draft.skip)  # [1, H]
        cache.commit(None, 1)  # the next draft token attends to this one in the kept layers
        confidence, token = draft.guess(hidden[0])
        chain.append(token)
        if confidence < gamma:
            break
    cache.rollback(committed)
    return chain


class SkipDrafter(Drafter):
    """A chain of 1 to `draft_length` tokens from the layer-skipping draft, ended by the adaptive threshold.
    `fine_tuned`: the component's fine-tuned draft drafts, not the base model with the decoder's skip map."""

    def __init__(self, decoder, cache: KVCache, draft_length: int = MAX_DRAFT, fine_tuned: bool = False):
        super().__init__(decoder, cache)
        parts = decoder.draft  # a LayerSkipParts (runtime/drafters/draft_parts.py)
        self.draft = parts.fine_tuned if fine_tuned else SkipDraft.of_base(decoder.model, parts.skip_map)
        self.draft_length, self.exiting = draft_length, DraftExit()

    def propose(self, root: int) -> Proposal:
        chain = draft_chain(self.draft, self.cache, root, self.exiting.gamma, self.draft_length)
        return Proposal(torch.tensor([root] + chain), chain_layout(len(chain)))  # [L + 1]

    def accept(self, proposal: Proposal, verified: Verified) -> None:
        self.exiting.update(len(verified.accepted) / (len(proposal.tokens) - 1))
