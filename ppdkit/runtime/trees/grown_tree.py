"""A draft tree grown every step from the feature head's own confidence (EAGLE-2's dynamic draft tree), where
the calibrated trees of runtime/drafters/heads_drafter.py are one static shape for every step; optionally merged with
ANPD's n-gram chain of the live text (runtime/drafters/anpd.py), so one tree carries the best guesses of both.

Expand: from the root, the head walks `beam` branches per level; every expanded node proposes its `beam` most
likely tokens, each valued by the product of the head's probabilities along its path (a log-probability sum),
and the `beam` most valuable proposals of a level are the ones expanded next. Growth stops at `depth` levels,
or once no proposal of a level could still be among the tree's nodes (a child is never worth more than its
parent). Merge: the chain's j-th token is worth rate^j, rate being how often a chain guess was right once its
predecessors were (measured while decoding); where the head proposed the same path, the higher value counts.
With `corpus`, a chain from the base model's own corpus is merged the same way, valued by how often guesses of each
kind (the context length they were read at, the follower's share) were right (runtime/drafters/corpus_ngrams.py).
With a fitted value model (runtime/trees/tree_values.py, the component's tree_values.json), every guess is valued
instead by the chance, fitted on held-out decoding, that it is the base model's token once its parent was, given what
each source said of it; the draft's guesses are valued that way while the tree grows too.
Rerank: the most valuable proposals become the tree; a parent is worth at least its children, so any prefix of
them by value holds every chosen node's path. One forward verifies the tree like any other, so the output is
the base model's whatever the head or the chain propose.

Size: a proposal's value estimates how often it is kept, so a tree of the n best proposals is expected to yield
1 + rho * (their values' sum) tokens, rho the running ratio of kept guesses to that estimate. Each step takes the
n with the most expected tokens per second, a step's time being the drafting's plus the forward's for 1 + n rows
(runtime/trees/tree_sizer.py's latency line, seeded by the tree profile and refitted on every step's time): a
confident step spends rows deep on one line, an unsure one spends few. Growth stops at the level below which no
proposal could be among those n, whatever else is proposed (StepCost.floor), so no level is drafted for nothing.
Never a slowdown: whether a step drafts at all is chosen by what drafted and plain steps measured in tokens per second
(runtime/batching/drafting_choice.py), so a draft that costs more than it keeps on this machine runs plain steps,
trying a drafted one now and then; a tree size given by name drafts every step, as asked.
"""

import math
import time
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ppdkit.models.draft_heads import draft_logits, feature_step

from ..batching.drafting_choice import DraftingChoice
from ..drafters.anpd import AdaptiveNgram
from ..drafters.corpus_ngrams import CorpusChain
from ..drafters.drafter import Drafter, Proposal, Verified
from ..forward.kv_cache import KVCache
from .tree_layout import shape_layout
from .tree_sizer import LatencyModel
from .tree_values import Evidence, TreeValues

PLAIN_PROBE = 64  # while drafting pays, one plain step in this many checks that it still does
CHOICE_RATE = 0.05  # a step's weight in the choice's running figures
BEAM, DEPTH = 2, 5  # beams 2-3 and depths 4-6 measured alike on SmolLM2 (MT-Bench, HumanEval, 10 prompts each)
CHAIN_LENGTH = 7  # ANPD's K


@dataclass
class Proposals:
    """Guesses after the root: each one's value (path log-probability), depth, token, parent (-1: the root) and the
    draft's log-probability of it given its parent (None: not the draft's guess)."""

    values: list[float] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    drafts: list[float | None] = field(default_factory=list)

    def add(self, value: float, depth: int, token: int, parent: int, draft: float | None = None) -> int:
        self.values.append(value)
        self.depths.append(depth)
        self.tokens.append(token)
        self.parents.append(parent)
        self.drafts.append(draft)
        return len(self.values) - 1


@dataclass(frozen=True)
class Frontier:
    """The nodes a level expands: their values and proposal indices (-1: the root)."""

    values: tuple[float, ...]
    proposals: tuple[int, ...]


ROOT = Frontier((0.0,), (-1,))  # the first level expands the root alone


def level_logp(logits: torch.Tensor) -> torch.Tensor:
    """A level's logits [m, V'] -> log-probabilities, float32; a draft gone bad (NaN, inf) proposes worthless
    guesses, never an order in which a child outranks its parent."""
    return torch.nan_to_num(torch.log_softmax(logits.float(), dim=-1), nan=-math.inf, posinf=0.0)


def level_top(logits: torch.Tensor, beam: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A level's logits [m, V'] -> each row's `beam` likeliest entries, best first: their log-probabilities [m, b]
    (level_logp's) and indices [m, b] into the draft vocabulary."""
    logp = level_logp(logits)
    top = logp.topk(min(beam, logp.shape[-1]), dim=-1)
    return top.values, top.indices


def grow_level(found: Proposals, top: tuple[torch.Tensor, torch.Tensor], frontier: Frontier, level: int,
               vocab: torch.Tensor, beam: int, wanted: int, last: bool, cost: "StepCost | None" = None,
               worth: TreeValues | None = None) -> tuple[list[int], torch.Tensor, Frontier] | None:
    """Add the `beam` likeliest children of every expanded node (`top`: level_top's log-probabilities [m, b] and
    indices [m, b] into the draft vocabulary `vocab`) to the proposals, in place, each valued by its parent's value
    plus its log-probability (`worth`: plus its fitted log-worth) -> (for the `beam` most valuable of them, their
    parents' rows among the expanded nodes [m'], their tokens [m'], the next frontier); None where growth stops: the
    last level, or nothing below this level could displace a proposal already among the `wanted` best, or (`cost`:
    the step's size is chosen by what rows cost) nothing below it could pay for its row. A level holds a few
    numbers: they are valued in Python, since on so few the dispatch of a tensor operation costs more than its
    arithmetic, and every step grows several levels."""
    drafts, tokens = top[0].tolist(), vocab[top[1]].tolist()  # m lists of b
    first = len(found.values)
    children = []  # (value, parent's row, token) in proposal order
    for row, (parent_value, parent, row_drafts, row_tokens) in enumerate(zip(frontier.values, frontier.proposals,
                                                                              drafts, tokens)):
        own = row_drafts if worth is None else worth.draft_worth(row_drafts, level,
                                                                  found.drafts[parent] if parent >= 0 else None)
        for value, draft, token in zip(own, row_drafts, row_tokens):
            value += parent_value
            found.add(value, level, token, parent, draft)
            children.append((value, row, token))
    if last:
        return None
    # the level's most valuable, the first proposed on ties
    best = sorted(range(len(children)), key=lambda i: -children[i][0])[:beam]
    # a child is never worth more than its parent: the level's best value bounds every deeper proposal's
    top_value = children[best[0]][0]
    if len(found.values) >= wanted and top_value < sorted(found.values, reverse=True)[wanted - 1]:
        return None
    if cost is not None and top_value < cost.floor(found.values):
        return None
    return ([children[i][1] for i in best], torch.tensor([children[i][2] for i in best]),
            Frontier(tuple(children[i][0] for i in best), tuple(first + i for i in best)))


def expand(model, heads, feature: torch.Tensor, root: int, wanted: int, beam: int, depth: int,
           cost: "StepCost | None" = None, worth: TreeValues | None = None) -> Proposals:
    """The head's proposals under `root` (feature [H]: the hidden state that chose it), at least `wanted` when the
    levels allow and (`cost`) their rows pay; `worth`: valued by the fitted model."""
    found = Proposals()
    state = feature_step(feature[None], model.embed_ids(torch.tensor([root])), *heads.layers)  # [1, H]
    frontier = ROOT
    for level in range(1, depth + 1):
        top = level_top(draft_logits(state, heads.readout), beam)  # [m, b] twice
        grown = grow_level(found, top, frontier, level, heads.vocab, beam, wanted, last=level == depth, cost=cost,
                           worth=worth)
        if grown is None:
            break
        parents, tokens, frontier = grown
        state = feature_step(state[parents], model.embed_ids(tokens), *heads.layers)  # [m', H]
    return found


def add_chain(found: Proposals, chain: list[int], rate: float) -> None:
    """Merge a chain of guesses under the root into the proposals, in place: its j-th token is worth rate^j."""
    step = math.log(min(max(rate, 1e-6), 1.0))
    add_valued_chain(found, chain, [j * step for j in range(1, len(chain) + 1)])


def add_valued_chain(found: Proposals, chain: list[int], values: list[float]) -> None:
    """Merge a chain of guesses under the root into the proposals, in place, its j-th token worth values[j - 1] (a
    log-value, not above the one before it), or the head's value for the same path when higher (values stay
    log-probabilities; a parent stays worth at least its children)."""
    index = {(p, t): i for i, (p, t) in enumerate(zip(found.parents, found.tokens))}
    parent = -1
    for j, (token, value) in enumerate(zip(chain, values), start=1):
        at = index.get((parent, token))
        if at is None:
            at = found.add(value, j, token, parent)
        else:
            found.values[at] = max(found.values[at], value)
        parent = at


def candidates(found: Proposals, chains: list[tuple[list[int], list[float], str]]) -> tuple[Proposals, list[Evidence]]:
    """The draft's proposals and the chains' guesses under the root as one set of candidates, each with what every
    source said of it (chains: each one's tokens, its guesses' rates given their predecessors, and its Evidence
    field) -> (the candidates, parents before children, values unset; their evidence)."""
    merged = Proposals()
    evidence = []
    def above(parent: int) -> float | None:  # the draft's probability of a node's parent
        draft = merged.drafts[parent] if parent >= 0 else None
        return None if draft is None else math.exp(draft)

    for i, parent in enumerate(found.parents):  # the draft's own, level by level: parents first
        draft = found.drafts[i]
        merged.add(0.0, found.depths[i], found.tokens[i], parent, draft)
        evidence.append({"depth": found.depths[i], "draft": None if draft is None else math.exp(draft),
                         "parent": above(parent)})
    index = {(p, t): i for i, (p, t) in enumerate(zip(merged.parents, merged.tokens))}
    for tokens, rates, source in chains:
        parent = -1
        for depth, (token, rate) in enumerate(zip(tokens, rates), start=1):
            at = index.get((parent, token))
            if at is None:
                at = index[(parent, token)] = merged.add(0.0, depth, token, parent)
                evidence.append({"depth": depth, "parent": above(parent)})
            evidence[at][source] = rate
            parent = at
    return merged, [Evidence(**e) for e in evidence]


def value_candidates(merged: Proposals, evidence: list[Evidence], values: TreeValues) -> None:
    """Each candidate's value, in place: its parent's plus its fitted log-worth (parents come first)."""
    worth = [values.worth(node) for node in evidence]
    for i, parent in enumerate(merged.parents):
        merged.values[i] = (merged.values[parent] if parent >= 0 else 0.0) + worth[i]


def by_value(found: Proposals, count: int) -> list[int]:
    """The `count` most valuable proposals (indices), parents before children: ordered by value, then depth, so
    a parent (worth at least its child, and shallower) always comes first."""
    order = sorted(range(len(found.values)), key=lambda i: (-found.values[i], found.depths[i], i))
    return order[:count]


def best_count(values: list[float], seconds: list[float], ratio: float, overhead: float = 0.0) -> int:
    """values: the chosen proposals' log-values, best first; seconds [n]: a forward's time with n rows (seconds[0]
    unused); ratio rho; overhead: a step's time besides its forward -> how many proposals to verify, the n
    maximising (1 + rho sum_{i<n} e^v_i) / (seconds[n + 1] + overhead)."""
    return best_rate(values, seconds, ratio, overhead)[0]


def best_rate(values: list[float], seconds: list[float], ratio: float, overhead: float = 0.0) -> tuple[int, float]:
    """best_count's n, and its expected tokens per second."""
    best, rate, expected = 0, 1.0 / (seconds[1] + overhead), 1.0
    for n, value in enumerate(values[:len(seconds) - 2], start=1):
        expected += ratio * math.exp(value)
        if expected / (seconds[n + 1] + overhead) > rate:
            best, rate = n, expected / (seconds[n + 1] + overhead)
    return best, rate


@dataclass
class StepCost:
    """What a step of a grown tree costs, as best_count weighs it: a forward's seconds by rows (a line: each row
    adds the same), the ratio rho, the drafting's seconds."""

    seconds: list[float]
    ratio: float
    overhead: float

    def count(self, values: list[float]) -> int:
        return best_count(values, self.seconds, self.ratio, self.overhead)

    def floor(self, values: list[float]) -> float:
        """The log-value below which no further proposal can be verified, whatever else is proposed; values: the
        proposals so far. A proposal worth v adds rho e^v tokens and one row's seconds b1 to any tree that takes
        it, so the tree's tokens per second (a mediant of the two) beat the best tree R* of the proposals so far
        only where rho e^v > b1 R*; more proposals only raise R*. Drafting the levels below that spends time on
        guesses no step verifies (on SmolLM2 the grown trees' deepest verified node averaged depth 2.7 of 4.2
        levels drafted)."""
        row = self.seconds[2] - self.seconds[1] if len(self.seconds) > 2 else 0.0
        if row <= 0 or self.ratio <= 0:
            return -math.inf  # rows come free: any proposal may pay
        rate = best_rate(sorted(values, reverse=True), self.seconds, self.ratio, self.overhead)[1]
        return math.log(row * rate / self.ratio)


def breadth_first(chosen: list[int], parents: list[int]) -> list[int]:
    """chosen proposals (parents first) level by level, each node's children together and in their order in `chosen`
    (their ranks unchanged): a tree then takes one order for each shape, so shape_layout's cache holds every shape of a
    step's few nodes (429 of 8 nodes). Ordered by value, one shape came numbered many ways (up to 7! for 8 nodes):
    on 24 MT-Bench prompts with trees of 8, 823 of 1,225 steps missed the cache (~0.1 ms each), 181 in this order."""
    children: dict[int, list[int]] = {}
    for proposal in chosen:
        children.setdefault(parents[proposal], []).append(proposal)
    order = list(children.get(-1, ()))
    for proposal in order:  # grows as it is walked: each node's children after the nodes before it
        order.extend(children.get(proposal, ()))
    return order


def tree_shape(chosen: list[int], parents: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """chosen proposals (parents first) and every proposal's parent proposal (-1: the root) -> the tree's node
    parents and ranks, node 0 the root, node i + 1 the i-th chosen; a node's rank counts its earlier siblings."""
    node = {proposal: i + 1 for i, proposal in enumerate(chosen)}
    tree_parents, ranks, siblings = [-1], [-1], {}
    for proposal in chosen:
        parent = 0 if parents[proposal] < 0 else node[parents[proposal]]
        tree_parents.append(parent)
        ranks.append(siblings.get(parent, 0))
        siblings[parent] = ranks[-1] + 1
    return tuple(tree_parents), tuple(ranks)


class ChainSource:
    """ANPD's n-gram chains of the live text, and how often a chain's guess is the base model's token once its
    predecessors were (starts at 1/2)."""

    def __init__(self, ids: list[int], length: int = CHAIN_LENGTH):
        self.ngrams, self.length, self.right, self.tried = AdaptiveNgram(ids), length, 1.0, 2.0

    @property
    def rate(self) -> float:
        return self.right / self.tried

    def draft(self, root: int) -> list[int]:
        self.ngrams.extend([root])
        return self.ngrams.draft(self.length)

    def update(self, chain: list[int], accepted: list[int], next_token: int) -> None:
        """Score the chain against the base model's tokens of this step, whether or not the tree held it."""
        known = accepted + [next_token]
        agree = next((j for j, (a, b) in enumerate(zip(chain, known)) if a != b), min(len(chain), len(known)))
        self.right += agree
        self.tried += agree + (agree < min(len(chain), len(known)))
        self.ngrams.extend(accepted)


def latency_model(profile: dict | None, rows: int, most_rows: int | None = None) -> LatencyModel:
    """The forward's time by rows, seeded with the decoder's tree profile (one token and each tree size up to
    `most_rows`, drafting excluded) and updated by every step; without a profile, seeded so that up to `rows` rows
    look cheap. A drafter passes its own size as most_rows: a line through a feature head's 88-row trees priced a row
    at ~12 ms on a 2-core AVX2 EPYC (float32: 1 row 44 ms, 8 rows 81 ms, 88 rows 1079 ms), so no guess paid and its
    sized trees kept 1.0 tokens a step; the batch engine's steps carry many answers' rows and keep every size."""
    model = LatencyModel()
    if profile:
        model.observe(1, profile["one_token_ms"] / 1000)
        for row in profile["rows"]:
            if most_rows is None or int(row["size"]) <= most_rows:
                model.observe(int(row["size"]), (row["latency_ms"] - row["draft_ms"]) / 1000)
    else:
        model.observe(1, 0.010)
        model.observe(rows, 0.010 * (1 + 0.02 * rows))
    return model


class GrownDrafter(Drafter):
    """A tree grown each step from a draft's confidence (`grow`: the feature head's, EAGLE-3's), with ANPD's chain
    merged in (`ngrams`), of at most `nodes` nodes, sized per step by what rows cost here (or fixed: tree_nodes);
    `rate` weighs a step in the running figures (guesses kept, their estimate, drafting time)."""

    def __init__(self, decoder, cache: KVCache, *, nodes: int, ngrams: bool = False, corpus: bool = False,
                 beam: int = BEAM, depth: int = DEPTH, rate: float = 0.1):
        super().__init__(decoder, cache)
        self.nodes, self.beam = tree_nodes(decoder, nodes, beam)
        self.most = self.nodes  # limit_nodes lowers nodes, never above this
        self.depth, self.rate, self.ngrams, self.chains = depth, rate, ngrams, None
        # the corpus's n-gram tables (read on first use), and this answer's chain of them
        self.corpus, self.corpus_chain = decoder.draft.corpus.table if corpus else None, None
        # the draft's fitted value model (runtime/trees/tree_values.py), if its component has one
        self.values: TreeValues | None = decoder.draft.tree_values
        # called with each step's candidates and their evidence, before they are valued (trainer/tree_values_fit.py)
        self.observe: Callable[[Proposals, list[Evidence]], None] | None = None
        self.fixed = decoder.draft.grown_nodes is not None  # every tree takes the nodes - 1 best, whatever they cost
        self.latency = latency_model(decoder.profile, self.nodes, most_rows=self.nodes)
        # running: guesses kept, their estimate, drafting seconds (of the steps that drafted)
        self.kept, self.estimated, self.drafting = 1.0, 1.0, 0.0
        # whether a step drafts at all, by what each choice measured; not while a batch's forward verifies this
        # tree with other answers' (limit_nodes shared: the batch engine chooses)
        self.choice, self.shared = DraftingChoice(CHOICE_RATE, weighs_one=True, plain_probe=PLAIN_PROBE), False
        # whether the last step drafted (the draft has read every verified row, an EAGLE-3 draft's cache), and whether
        # it went unweighed: a step that drafts after plain ones (or the prompt) first reads what they verified, a
        # cost of switching, not of drafting (counted, the prompt's rows sent a third of bf16's steps plain)
        self.drafted_last, self.unweighed = False, False
        # this step's proposals, chosen ones, chains (the live text's, the corpus's), and whether it drafted at all
        # (limit_nodes 1, or the choice: the root alone)
        self.step: tuple[Proposals, list[int], tuple[list[int], list[int]], bool] | None = None

    def prompt_read(self, ids: torch.Tensor, hidden: torch.Tensor, states: torch.Tensor | None) -> None:
        self.chains = ChainSource(ids.tolist()) if self.ngrams else None
        self.corpus_chain = CorpusChain(self.corpus, ids.tolist()) if self.corpus is not None else None

    @abstractmethod
    def grow(self, root: int, wanted: int, cost: StepCost | None = None) -> Proposals:
        """The draft's proposals under `root`, at least `wanted` when the levels allow and (`cost`) their rows pay."""

    def limit_nodes(self, nodes: int, shared: bool = False) -> None:
        """Trees of at most `nodes` nodes from the next step (a batch's share of one forward's rows,
        runtime/batching/batch_engine.py, `shared` with other answers' rows); at 1 the root goes alone and nothing
        is drafted."""
        self.nodes, self.shared = max(1, min(self.most, nodes)), shared

    def chooses(self) -> bool:
        """Whether this drafter chooses, step by step, to draft or not: not where its tree size was given by name,
        where a batch verifies it with other answers (the batch engine chooses), or where its steps are observed
        (every step's candidates are wanted: trainer/tree_values_fit.py)."""
        return not (self.fixed or self.shared or self.observe is not None)

    def propose(self, root: int) -> Proposal:
        if self.nodes == 1 or (self.chooses() and not self.unweighed and not self.choice.choose(1)):
            # the root alone: no tree to draft (the n-gram chains still learn the root)
            self.step = Proposals(), [], self._chains(root), False
            return Proposal(torch.tensor([root]), shape_layout((-1,), (-1,)))
        started = time.perf_counter()
        b0, b1 = self.latency.coefficients()
        cost = None if self.fixed else StepCost([b0 + b1 * rows for rows in range(self.nodes + 1)],
                                                self.kept / max(self.estimated, 1e-9), self.drafting)
        found = self.grow(root, self.nodes - 1, cost)
        grown = time.perf_counter()
        chains = self._chains(root)
        chained = time.perf_counter()
        if self.values is not None or self.observe is not None:
            merged, evidence = candidates(found, self._chain_evidence(chains))
            if self.observe is not None:
                self.observe(merged, evidence)
        if self.values is not None:
            value_candidates(merged, evidence, self.values)
            found = merged
        else:
            add_chain(found, chains[0], self.chains.rate if self.chains else 0.0)
            if self.corpus_chain is not None:
                add_valued_chain(found, chains[1], self.corpus_chain.values())
        chosen = by_value(found, self.nodes - 1)
        if cost is not None:
            chosen = chosen[:cost.count([found.values[i] for i in chosen])]
        chosen = breadth_first(chosen, found.parents)
        self.step = found, chosen, chains, True
        proposal = Proposal(torch.tensor([root] + [found.tokens[i] for i in chosen]),  # [N]
                            shape_layout(*tree_shape(chosen, found.parents)))
        # where the drafting goes (the bench's breakdown): the draft's levels, the n-gram chains, the choice and layout
        proposal.parts = {"grow": grown - started, "chains": chained - grown, "choose": time.perf_counter() - chained}
        return proposal

    def _chains(self, root: int) -> tuple[list[int], list[int]]:
        """This step's chains under `root`: the live text's (ANPD's) and the corpus's, [] where not drafted."""
        return (self.chains.draft(root) if self.chains else [],
                self.corpus_chain.draft(root) if self.corpus_chain is not None else [])

    def _chain_evidence(self, chains: tuple[list[int], list[int]]) -> list[tuple[list[int], list[float], str]]:
        """This step's chains with their guesses' running rates, as `candidates` reads them."""
        out = []
        if self.chains:
            out.append((chains[0], [self.chains.rate] * len(chains[0]), "chain"))
        if self.corpus_chain is not None:
            out.append((chains[1], self.corpus_chain.rates(), "corpus"))
        return out

    def accept(self, proposal: Proposal, verified: Verified) -> None:
        found, chosen, chains, drafted = self.step
        self.unweighed = drafted and not self.drafted_last
        if self.chooses() and not self.unweighed:
            self.choice.observe(1, drafted, len(verified.accepted) + 1,
                                verified.seconds["draft"] + verified.seconds["verify"])
        self.drafted_last = drafted
        if self.chains:
            self.chains.update(chains[0], verified.accepted, verified.next_token)
        if self.corpus_chain is not None:
            self.corpus_chain.update(chains[1], verified.accepted, verified.next_token)
        if not drafted:  # the running figures say what drafting gives and costs: a step without it says nothing
            return
        rate = self.rate
        self.drafting = (1 - rate) * self.drafting + rate * verified.seconds["draft"]
        self.latency.observe(proposal.layout.size, verified.seconds["verify"])
        self.kept = (1 - rate) * self.kept + rate * len(verified.accepted)
        self.estimated = (1 - rate) * self.estimated + rate * sum(math.exp(found.values[i]) for i in chosen)


class FeatureDrafter(GrownDrafter):
    """The feature head's grown tree: it drafts from the last verified token's final hidden state."""

    def __init__(self, decoder, cache: KVCache, **grown):
        super().__init__(decoder, cache, **grown)
        self.heads, self.feature = decoder.draft.heads, None

    def prompt_read(self, ids: torch.Tensor, hidden: torch.Tensor, states: torch.Tensor | None) -> None:
        super().prompt_read(ids, hidden, states)
        self.feature = hidden[-1]

    def grow(self, root: int, wanted: int, cost: StepCost | None = None) -> Proposals:
        return expand(self.model, self.heads, self.feature, root, wanted, self.beam, self.depth, cost, self.values)

    def accept(self, proposal: Proposal, verified: Verified) -> None:
        super().accept(proposal, verified)
        self.feature = verified.hidden[verified.final]


def tree_nodes(decoder, nodes: int, beam: int) -> tuple[int, int]:
    """A grown tree's most nodes and proposals per level: the method's (the size then chosen per step), or
    the draft's grown_nodes (tree_size: every tree that many nodes), with sqrt(N) proposals per level so that a wide
    tree can fill."""
    fixed = decoder.draft.grown_nodes
    if fixed is None:
        return nodes, beam
    return fixed, max(beam, round(fixed ** 0.5))
