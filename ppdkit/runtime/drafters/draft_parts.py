"""What a decoder drafts with: the parts of the one component it loaded, as one object of one kind.

A Decoder holds its base model and one `DraftParts`: none (the base model alone: ar, ANPD, Self-Draft), PPD's
prompt tokens and calibrated trees, draft heads and their trees, an EAGLE-3 draft, or a layer-skip map (and its
fine-tuned draft). Each kind says what it carries (the `Need`s of runtime/decoding_methods.py), how many rows a step
of a method feeds the model, and how its tree size is chosen; the methods' drafters (runtime/drafters/drafter.py) read
their parts from it. Three parts any kind may have: the corpus n-gram table (ppd-lookup's and Self-Draft's), ProPD's
early head (a second component, read by the pruning methods) and the base model's corpus (eagle3-corpus)."""

from dataclasses import dataclass, field

from ppdkit.models.ngram_table import NgramTable

from ..decoding_methods import DecodingMethod, Need, lookup_rows
from ..trees.pruning import EarlyHead
from ..trees.tree import DynamicTree
from ..trees.tree_layout import TreeLayout, layout_tree
from ..trees.tree_sizer import TreeSizer
from ..trees.tree_values import TreeValues
from .corpus_ngrams import CorpusLookup
from .eagle3_drafter import Eagle3Set
from .heads_drafter import DraftHeadSet, HeadTree, draft_seconds
from .layer_skip import SkipDraft
from .lookup import root_only, with_lookup_chains
from .ppd import PromptTokenSet


@dataclass(kw_only=True, eq=False)
class DraftParts:
    """No component: the base model drafts for itself (ar, anpd, self-draft)."""

    ngrams: NgramTable | None = None  # the component's corpus n-gram table (ppd-lookup, self-draft)
    early_head: EarlyHead | None = None  # ProPD's early prediction head, for the pruning methods
    grown_nodes: int | None = None  # grown trees fixed at this many nodes (tree_size), not sized per step
    corpus: CorpusLookup | None = None  # the base model's corpus, as n-gram tables read on first use (eagle3-corpus)
    tree_values: TreeValues | None = None  # a grown tree's fitted value model (its component's tree_values.json)

    def carries(self) -> set[Need]:
        return ({Need.EARLY_HEAD} if self.early_head is not None else set()) | \
            ({Need.CORPUS} if self.corpus is not None else set())

    def step_rows(self, method: DecodingMethod) -> int:
        """The most rows one step of `method` feeds the model."""
        if method.grown and self.grown_nodes is not None:
            return self.grown_nodes
        return method.chain_rows

    def profile_arguments(self, model) -> dict:
        """trees/profile.py profile_trees' arguments for this draft's trees on `model` (the decoder's LeanLlama)."""
        return {"drafter": "ppd"}

    def new_sizer(self, profile: dict | None) -> TreeSizer | None:
        """A fresh tree sizer for one generate call (trees/tree_sizer.py), where the tree size is chosen per step."""
        return None

    def identity(self) -> str:
        """What beyond the component's bytes makes this draft another (a skip map given at load)."""
        return ""


@dataclass(kw_only=True, eq=False)
class SizedParts(DraftParts):
    """Calibrated trees of several sizes: one in use (`size`, the profile's choice or the one asked for), or with
    `dynamic_size` the one the sizer picks each step from their expected tokens per step (`taus`) and rows."""

    size: int = 0
    dynamic_size: bool = False
    taus: dict[int, float] = field(default_factory=dict)  # calibrated size -> expected tokens per step

    def use_size(self, size: int, dynamic_size: bool = False) -> None:
        """Decode with the calibrated tree of `size` (and with dynamic_size every tree, sized per step)."""
        self.size, self.dynamic_size = size, dynamic_size

    def rows_by_size(self) -> dict[int, int]:
        raise NotImplementedError

    def new_sizer(self, profile: dict | None) -> TreeSizer | None:
        if not self.dynamic_size or len(self.taus) < 2:
            return None
        return TreeSizer.from_profile(self.taus, self.rows_by_size(), profile, self.size)


@dataclass(kw_only=True, eq=False)
class PromptTokenParts(SizedParts):
    """PPD's trained prompt tokens (with a custom decoding head, for ept-head) and their calibrated trees by size;
    `lookup_chains` is ppd-lookup's chains per step: the context's first, then the n-gram table's. The layouts by
    state are built for the size in use (none until one is chosen), and with dynamic_size for every size."""

    prompts: PromptTokenSet
    trees: dict[int, DynamicTree] = field(default_factory=dict)
    lookup_chains: int = 1

    def __post_init__(self):
        if self.lookup_chains < 1:
            raise ValueError(f"lookup_chains must be at least 1 (the context's chain), not {self.lookup_chains}")
        self.taus = {size: tree.tau for size, tree in self.trees.items()}
        self.states: dict[int, dict] = {}  # size -> state -> the tree used when that many guess distances are known
        self.size_layouts: dict[int, dict[int, TreeLayout]] = {}  # size -> state -> its layout
        self._lookup_layouts: dict[tuple, TreeLayout] = {}  # built on first use by ppd-lookup
        self.ranks = 1  # the most guesses per distance any tree reads
        if self.size in self.trees:  # else laid out once a size is chosen (use_size)
            self.use_size(self.size, self.dynamic_size)

    @classmethod
    def of_tree(cls, prompts: PromptTokenSet, tree: DynamicTree | None, **parts) -> "PromptTokenParts":
        """Prompt tokens with one calibrated tree (or none yet)."""
        return cls(prompts=prompts, trees={} if tree is None else {tree.size: tree}, size=tree.size if tree else 0,
                   **parts)

    def _lay_out(self, size: int) -> None:
        # state 0: the last step ended on a lookup node, which has no prompt tokens behind it
        states = {0: root_only(self.prompts.k), **self.trees[size].states}
        self.states[size] = states
        self.size_layouts[size] = {k: layout_tree(s, self.prompts.n, self.prompts.mask_kind) for k, s in states.items()}
        self.ranks = max(self.ranks, 1 + max(max(s.ranks) for s in self.trees[size].states.values()))

    def use_size(self, size: int, dynamic_size: bool = False) -> None:
        super().use_size(size, dynamic_size)
        for s in (self.trees if dynamic_size else [size]):
            if s not in self.size_layouts:
                self._lay_out(s)

    @property
    def tree(self) -> DynamicTree | None:
        return self.trees.get(self.size)

    @property
    def layouts(self) -> dict[int, TreeLayout]:
        """The layouts by state of the tree in use."""
        return self.size_layouts.get(self.size, {})

    def rows_by_size(self) -> dict[int, int]:
        return {size: max(layout.size for layout in layouts.values()) for size, layouts in self.size_layouts.items()}

    def lookup_layout(self, state: int, chains: int, length: int, size: int | None = None) -> TreeLayout:
        """The tree of `state` (of calibrated size `size`, default the one in use) with `chains` lookup chains
        of `length` nodes under its root."""
        size = self.size if size is None else size
        key = (state, chains, length, size)
        if key not in self._lookup_layouts:
            grown = with_lookup_chains(self.states[size][state], chains, length)
            self._lookup_layouts[key] = layout_tree(grown, self.prompts.n, self.prompts.mask_kind)
        return self._lookup_layouts[key]

    def carries(self) -> set[Need]:
        carried = super().carries() | {Need.PROMPT_TOKENS}
        if self.prompts.head is not None:
            carried.add(Need.HEAD)
        if self.layouts:
            carried.add(Need.TREES)
        return carried

    def step_rows(self, method: DecodingMethod) -> int:
        if Need.TREES not in method.needs or not self.layouts:
            return super().step_rows(method)
        largest = max(layout.size for layouts in self.size_layouts.values() for layout in layouts.values())
        return largest + (lookup_rows(self.lookup_chains + method.corpus_chains) if method.lookup else 0)


@dataclass(kw_only=True, eq=False)
class HeadParts(SizedParts):
    """Draft heads over the base model's features (feature-head, medusa) and their calibrated trees by size."""

    heads: DraftHeadSet
    trees: dict[int, HeadTree] = field(default_factory=dict)

    @property
    def head_tree(self) -> HeadTree | None:
        """The calibrated tree in use (None before calibration: the grown-tree methods still run)."""
        return self.trees.get(self.size)

    def rows_by_size(self) -> dict[int, int]:
        return {size: tree.layout.size for size, tree in self.trees.items()}

    def carries(self) -> set[Need]:
        carried = super().carries() | {Need.FEATURE_HEAD if self.heads.kind == "feature" else Need.MEDUSA_HEADS}
        if self.head_tree is not None:
            carried.add(Need.HEAD_TREE)
        return carried

    def step_rows(self, method: DecodingMethod) -> int:
        if Need.HEAD_TREE in method.needs and self.head_tree is not None:
            return max(tree.layout.size for tree in self.trees.values())
        return super().step_rows(method)

    def profile_arguments(self, model) -> dict:
        """The heads draft before the forward: a step's drafting time with the tree of a size counts when a tree size
        is chosen."""
        return {"drafter": "heads", "draft_seconds": lambda size: draft_seconds(model, self.heads, self.trees[size])}


@dataclass(kw_only=True, eq=False)
class Eagle3Parts(DraftParts):
    """EAGLE-3's draft layer over three of the base model's hidden states; its trees are grown each step."""

    eagle3: Eagle3Set

    def carries(self) -> set[Need]:
        return super().carries() | {Need.EAGLE3_DRAFT} | (
            {Need.EAGLE3_PROMPT_TOKENS} if self.eagle3.parallel is not None else set())


@dataclass(kw_only=True, eq=False)
class LayerSkipParts(DraftParts):
    """The base model drafting with some sub-layers skipped (`skip_map`, per decoder layer 0 keep, 1 skip the
    attention, 2 the MLP, 3 both), and for skip-finetune the fine-tuned draft's norms and head."""

    skip_map: tuple[int, ...]
    fine_tuned: SkipDraft | None = None

    def carries(self) -> set[Need]:
        return super().carries() | {Need.SKIP_MAP} | ({Need.SKIP_DRAFT} if self.fine_tuned is not None else set())

    def identity(self) -> str:
        return "-skip" + "".join(map(str, self.skip_map))

