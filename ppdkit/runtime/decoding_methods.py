"""The decoding methods, in one registry: `Decoder.generate(method=NAME)`, `ppdkit decode` and `bench`, and
the job spec's evaluate.methods look names up here, so a new method is one entry plus its drafter
(runtime/drafters/drafter.py), which the one decode loop (runtime/loop.py) runs.

Every method gives the base model's own tokens: greedy output identical to `ar`, sampled output with
the base model's distribution under speculative acceptance (runtime/acceptance.py). This module imports
nothing heavy (the CLI and the spec read it); a method's drafter is imported when first used.
"""

import importlib
from dataclasses import dataclass, field
from enum import Enum


class Need(Enum):
    """What a component can carry that a method may need (Decoder.carries says which a decoder has); each value is
    how an error names it to a user, with where it comes from."""

    PROMPT_TOKENS = "prompt tokens"
    TREES = "calibrated trees"
    HEAD = "a custom decoding head"
    FEATURE_HEAD = "a feature draft head"
    MEDUSA_HEADS = "Medusa heads"
    HEAD_TREE = "a calibrated head tree"
    EARLY_HEAD = "an early prediction head (Decoder.from_pretrained(early_head=...), --early-head)"
    SKIP_MAP = "a layer-skip map (--base NAME --skip-map ..., Decoder.from_base(skip_map=...))"
    SKIP_DRAFT = "a fine-tuned layer-skip draft (train.method skip-finetune)"
    EAGLE3_DRAFT = "an EAGLE-3 draft (train.method eagle3)"
    EAGLE3_PROMPT_TOKENS = "an EAGLE-3 draft with prompt tokens (train.method eagle3, train.parallel_draft true)"
    CORPUS = ("the base model's self-distilled corpus (committed for catalog base models in "
              "ppdkit/data_pipeline/corpora/NAME; grow one with `ppdkit corpus grow`)")

GROWN_NODES = 8  # the most nodes of a grown tree (the root included); each step takes what pays of them
# N, L, G, C of runtime/drafters/self_draft.py. The paper's G = 4; N and L (6 and 6) it chose by a grid search on its
# GPU, where more rows a step cost almost nothing. On a few CPU cores every row costs, so one short branch pays best:
# these won a grid search on prompts the bench does not use (MT-Bench and HumanEval prompts 10-19) against the
# older (2, 4, 3, 4) and their neighbours (the figures: docs/history.md).
SELF_DRAFT = {"branches": 1, "branch_length": 2, "gram": 4, "candidates": 2}
LOOKUP_LENGTHS = (3, 6, 12)  # a lookup chain's nodes: 3 (the prompt tokens' reach), doubled after a chain
# was accepted whole (the text is copying itself, so a longer copy is likely kept too; it paid most on code:
# docs/history.md)


@dataclass(frozen=True)
class DecodingMethod:
    name: str
    summary: str
    needs: tuple[Need, ...]
    drafter: str | None  # "module:Class" under ppdkit.runtime, a Drafter (None: auto, which runs another method's)
    options: dict = field(default_factory=dict)  # keyword arguments of the drafter
    # its steps can share a forward with other answers' (runtime/batching/batch_engine.py): not where the draft runs the
    # base model itself outside the verification (layer skipping) or the verification stops part-way (early pruning)
    shares_steps: bool = True

    @property
    def lookup(self) -> bool:
        """Its steps carry lookup chains beside the tree (more rows per step)."""
        return self.options.get("lookup", False)

    @property
    def corpus_chains(self) -> int:
        """Lookup chains its steps carry beyond the component's lookup_chains: the corpus's (ppd-corpus)."""
        return int(self.options.get("corpus", False) and self.lookup)

    @property
    def grown(self) -> bool:
        """Its tree is grown each step from the draft's confidence (runtime/trees/grown_tree.py), not calibrated."""
        grown_modules = ("trees.grown_tree", "drafters.eagle3_drafter")
        return self.drafter is not None and self.drafter.split(":")[0] in grown_modules

    @property
    def chain_rows(self) -> int:
        """The most rows of a step of a drafter without calibrated trees (anpd, feature-grown): the root and its
        guesses; 1 for the others."""
        return self.options.get("nodes", 1 + self.options.get("draft_length", 0))

    @property
    def sized(self) -> bool:
        """Its calibrated trees may be sized per step (Decoder.dynamic_size: a TreeSizer)."""
        return Need.TREES in self.needs or Need.HEAD_TREE in self.needs

    def build(self, decoder, cache, sizer=None):
        """This method's drafter for one answer of `decoder` into `cache` (`sizer`: for a sized method)."""
        if self.drafter is None:
            raise ValueError(f"{self.name} runs another method's drafter: resolve it first (Decoder.fastest_method)")
        module, name = self.drafter.split(":")
        drafter = getattr(importlib.import_module(f"ppdkit.runtime.{module}"), name)
        return drafter(decoder, cache, **self.options, **({"sizer": sizer} if self.sized else {}))


METHODS: dict[str, DecodingMethod] = {m.name: m for m in (
    DecodingMethod("ar", "plain decoding on the lean forward, one token per step", (), "drafters.ar:PlainDrafter"),
    DecodingMethod("auto", "the fastest method this decoder serves here, chosen by a short measured trial once per "
                   "machine (never a drafter that does not beat ar there)", (), None),
    DecodingMethod("anpd", "ANPD: a chain of up to 7 guesses from the live text's multi-level n-grams (N up to 5); "
                   "no component needed", (), "drafters.anpd:AnpdDrafter", {"max_n": 5, "draft_length": 7}),
    DecodingMethod("self-draft", "Self-Draft: drafting branches of the model's own guesses ride in the verification "
                   "forward and fill a context cache of n-grams, whose continuations of the last token are verified "
                   "(plus the corpus table's, when the component has one); no component needed", (),
                   "drafters.self_draft:SelfDrafter", SELF_DRAFT | {"nodes": 1 + SELF_DRAFT["candidates"] * SELF_DRAFT[
                       "gram"] + SELF_DRAFT["branches"] * SELF_DRAFT["branch_length"]}),
    DecodingMethod("skip", "Draft & Verify: the base model with sub-layers skipped drafts a chain (adaptive exit), "
                   "the whole model verifies it", (Need.SKIP_MAP,), "drafters.layer_skip:SkipDrafter",
                   {"draft_length": 12}, shares_steps=False),
    DecodingMethod("skip-ft", "skip with the component's fine-tuned draft (the D&V paper's appendix F): more "
                   "sub-layers skipped, its own norms and a draft-vocabulary head", (Need.SKIP_DRAFT,),
                   "drafters.layer_skip:SkipDrafter", {"draft_length": 12, "fine_tuned": True}, shares_steps=False),
    DecodingMethod("ppd", "the prompt tokens' dynamic sparse tree, verified in the same forward",
                   (Need.PROMPT_TOKENS, Need.TREES), "drafters.ppd:PpdDrafter"),
    DecodingMethod("ppd-lookup", "ppd plus a chain copied from the text's earlier occurrence of its ending",
                   (Need.PROMPT_TOKENS, Need.TREES), "drafters.ppd:PpdDrafter", {"lookup": True}),
    DecodingMethod("ppd-corpus", "ppd-lookup with a chain from the base model's own corpus first: what most often "
                   "followed the text's longest ending in its self-distilled answers (eagle3-corpus's chain)",
                   (Need.PROMPT_TOKENS, Need.TREES, Need.CORPUS), "drafters.ppd:PpdDrafter",
                   {"lookup": True, "corpus": True}),
    DecodingMethod("ppd-head", "ppd with the guesses read through the component's custom decoding head",
                   (Need.PROMPT_TOKENS, Need.TREES, Need.HEAD), "drafters.ppd:PpdDrafter", {"head": True}),
    DecodingMethod("feature-head", "a tree drafted by the feature head from the last hidden state, level by level",
                   (Need.FEATURE_HEAD, Need.HEAD_TREE), "drafters.heads_drafter:HeadsDrafter"),
    DecodingMethod("feature-grown", "a tree grown each step from the feature head's confidence (EAGLE-2), its size "
                   "chosen per step", (Need.FEATURE_HEAD,), "trees.grown_tree:FeatureDrafter", {"nodes": GROWN_NODES}),
    DecodingMethod("feature-grown-anpd", "feature-grown with ANPD's n-gram chain of the live text merged into the tree",
                   (Need.FEATURE_HEAD,), "trees.grown_tree:FeatureDrafter", {"nodes": GROWN_NODES, "ngrams": True}),
    DecodingMethod("eagle3", "a tree grown each step from the EAGLE-3 draft's confidence (EAGLE-2/3's dynamic tree), "
                   "its size chosen per step", (Need.EAGLE3_DRAFT,), "drafters.eagle3_drafter:Eagle3Drafter",
                   {"nodes": GROWN_NODES}),
    DecodingMethod("eagle3-anpd", "eagle3 with ANPD's n-gram chain of the live text merged into the tree",
                   (Need.EAGLE3_DRAFT,), "drafters.eagle3_drafter:Eagle3Drafter",
                   {"nodes": GROWN_NODES, "ngrams": True}),
    DecodingMethod("eagle3-corpus", "eagle3-anpd with a chain from the base model's own corpus merged too: what "
                   "most often followed the text's longest ending (up to 6 tokens) in its self-distilled answers",
                   (Need.EAGLE3_DRAFT, Need.CORPUS), "drafters.eagle3_drafter:Eagle3Drafter",
                   {"nodes": GROWN_NODES, "ngrams": True, "corpus": True}),
    DecodingMethod("eagle3-ppd", "eagle3 with the draft's prompt tokens: every depth guessed in one draft forward "
                   "(the PPD thesis's synergy, 6.4; P-EAGLE), the tree grown over those guesses",
                   (Need.EAGLE3_DRAFT, Need.EAGLE3_PROMPT_TOKENS), "drafters.eagle3_drafter:Eagle3ParallelDrafter",
                   {"nodes": GROWN_NODES}),
    DecodingMethod("eagle3-ppd-corpus", "eagle3-ppd with ANPD's chain of the live text and the corpus's chain merged, "
                   "as eagle3-corpus merges them", (Need.EAGLE3_DRAFT, Need.EAGLE3_PROMPT_TOKENS, Need.CORPUS),
                   "drafters.eagle3_drafter:Eagle3ParallelDrafter", {"nodes": GROWN_NODES, "ngrams": True,
                                                                     "corpus": True}),
    DecodingMethod("medusa", "a tree drafted by Medusa-1 heads from the last hidden state",
                   (Need.MEDUSA_HEADS, Need.HEAD_TREE), "drafters.heads_drafter:HeadsDrafter"),
    DecodingMethod("ppd-prune", "ppd with ProPD's early pruning of the tree (nodes and their prompt tokens) after "
                   "layer n", (Need.PROMPT_TOKENS, Need.TREES, Need.EARLY_HEAD), "drafters.ppd:PpdDrafter",
                   {"prune": True}, shares_steps=False),
    DecodingMethod("feature-head-prune", "feature-head with ProPD's early pruning of the tree after layer n",
                   (Need.FEATURE_HEAD, Need.HEAD_TREE, Need.EARLY_HEAD), "drafters.heads_drafter:HeadsDrafter",
                   {"prune": True}, shares_steps=False),
    DecodingMethod("medusa-prune", "medusa with ProPD's early pruning of the tree after layer n",
                   (Need.MEDUSA_HEADS, Need.HEAD_TREE, Need.EARLY_HEAD), "drafters.heads_drafter:HeadsDrafter",
                   {"prune": True}, shares_steps=False),
)}


# the methods every decoder serves, whatever its component: plain decoding, ANPD, Self-Draft, and auto's choice
COMPONENT_FREE = ("ar", "anpd", "self-draft", "auto")


def get_method(name: str) -> DecodingMethod:
    if name not in METHODS:
        raise ValueError(f"unknown decoding method {name!r}; use one of {', '.join(METHODS)}")
    return METHODS[name]


def lookup_rows(chains: int) -> int:
    """The most lookup nodes a step adds: `chains` short chains, or one chain grown long."""
    return max(chains * LOOKUP_LENGTHS[0], LOOKUP_LENGTHS[-1])
