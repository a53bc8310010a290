"""What a grown tree's guess is worth, fitted: the chance that a node is the base model's greedy token once its parent
was, from every source that proposed it (the draft, the corpus's chain, ANPD's chain of the live text).

Without it a grown tree (runtime/trees/grown_tree.py) values a draft guess by the draft's probability and a chain's
guess by its chain's running rate, and where both propose the same token it keeps the higher. Both under-rate a guess
for greedy decoding: the draft learned the base model's *distribution*, and a token the base model gives 0.5 is its
greedy choice every time it is the argmax; on held-out corpus prompts a draft guess of 0.55 was the base's token
0.70-0.75 of the times its parent was, and two sources agreeing are worth more than either alone. A logistic model over
the sources' evidence (`FEATURES`) says how much, fitted on the draft's own held-out decoding
(trainer/tree_values_fit.py) and shipped in the component as `tree_values.json`. Depth weighs each source's guesses
apart, and so does what the draft said of the node's parent, or that it never proposed the parent (a chain's guess under
a chain's guess). A node's value is then its parent's plus log sigmoid(w . features): never above its parent's, so any
prefix of the proposals by value holds every chosen node's path, as before. Only which guesses a step verifies changes;
what the step keeps is the base model's choice either way.
"""

import functools
import math
from dataclasses import dataclass

import torch

FORMAT = "ppdkit-tree-values/2"
TREE_VALUES = "tree_values"  # the component's extra: tree_values.json
FEATURES = ("bias", "draft", "draft_logit", "corpus", "corpus_logit", "chain", "chain_logit", "draft_and_corpus",
            "draft_and_chain", "depth", "first_level", "corpus_depth", "chain_depth", "parent_draft_logit",
            "parent_undrafted")
# the first format's features, each file of it read with the others at 0: the same values as it gave
FORMATS = {"ppdkit-tree-values/1": FEATURES[:10], FORMAT: FEATURES}
_EDGE = 1e-6  # probabilities clipped to [EDGE, 1 - EDGE] before their logit: a 0 or 1 rate stays finite
# the same bounds as float32 holds them (feature_rows clips in float32): worth's logit at a bound is the fit's
_LOW, _HIGH = torch.tensor([_EDGE, 1 - _EDGE], dtype=torch.float32).tolist()
PROBABILITY_BOUNDS = (_LOW, _HIGH)  # as worth clips a probability (runtime/kernels/eagle3_grow.cpp takes them)


@dataclass(frozen=True)
class Evidence:
    """What each source said of one node: its probability (draft: of the token given its parent; corpus and chain: their
    running rate for a guess of this kind), None where that source did not propose it."""

    depth: int
    draft: float | None = None
    corpus: float | None = None
    chain: float | None = None
    parent: float | None = None  # the draft's probability of the node's parent; None at the root, or not the draft's


def _logit(p: torch.Tensor) -> torch.Tensor:
    p = p.clamp(_EDGE, 1 - _EDGE)
    return torch.log(p) - torch.log1p(-p)


def feature_rows(depth: torch.Tensor, draft: torch.Tensor, corpus: torch.Tensor, chain: torch.Tensor,
                 parent: torch.Tensor) -> torch.Tensor:
    """Nodes' evidence as tensors [n] (a probability, NaN where the source did not propose the node or, for parent,
    the parent; depth from 1) -> their features [n, len(FEATURES)], float32."""
    has = [(~torch.isnan(p)).float() for p in (draft, corpus, chain, parent)]  # 4 x [n]
    logits = [torch.where(h > 0, _logit(torch.nan_to_num(p, nan=0.5).float()), 0.0)
              for h, p in zip(has, (draft, corpus, chain, parent))]
    below = depth.float() - 1  # levels below the first
    return torch.stack([torch.ones_like(has[0]), has[0], logits[0], has[1], logits[1], has[2], logits[2],
                        has[0] * has[1], has[0] * has[2], below, (below == 0).float(), below * has[1], below * has[2],
                        logits[3], (below > 0).float() * (1 - has[3])], dim=-1)


def evidence_rows(nodes: list[Evidence]) -> torch.Tensor:
    """Evidence -> features [n, len(FEATURES)]."""
    def column(name: str) -> torch.Tensor:
        return torch.tensor([math.nan if getattr(e, name) is None else getattr(e, name) for e in nodes],
                            dtype=torch.float64)
    return feature_rows(torch.tensor([e.depth for e in nodes]), column("draft"), column("corpus"), column("chain"),
                        column("parent"))


def _clipped_logit(p: float) -> float:
    p = min(max(p, _LOW), _HIGH)
    return math.log(p) - math.log1p(-p)


@dataclass(frozen=True)
class TreeValues:
    """The fitted weights (one per FEATURES name) and how they were fitted (prompts, samples, the measure on them)."""

    weights: tuple[float, ...]
    fitted: dict

    @functools.cached_property
    def named(self) -> dict[str, float]:
        """The weights by FEATURES name, made once: worth reads them for every node of every step."""
        return dict(zip(FEATURES, self.weights))

    def weights_named(self, names: tuple[str, ...]) -> list[float]:
        """The weights of `names`, in that order (the native grow's, drafters/eagle3_drafter.py GROW_WEIGHTS)."""
        return [self.named[name] for name in names]

    def log_worth(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., F] -> log P(the node is the base's token | its parent was) [...], float32, below 0."""
        return torch.nn.functional.logsigmoid(features @ torch.tensor(self.weights, dtype=features.dtype))

    def worth(self, node: Evidence) -> float:
        """log_worth's number for one node's evidence, in Python's floats: a grown tree values its candidates this way
        every step, a few dozen numbers, where a tensor operation's dispatch costs more than its arithmetic."""
        w = self.named
        below = node.depth - 1
        z = w["bias"] + w["depth"] * below + w["first_level"] * (below == 0)
        said = set()  # the sources that proposed the node
        for source in ("draft", "corpus", "chain"):
            p = getattr(node, source)
            if p is not None and not math.isnan(p):
                said.add(source)
                z += w[source] + w[f"{source}_logit"] * _clipped_logit(p)
        if "draft" in said:
            z += w["draft_and_corpus"] * ("corpus" in said) + w["draft_and_chain"] * ("chain" in said)
        z += below * (w["corpus_depth"] * ("corpus" in said) + w["chain_depth"] * ("chain" in said))
        if node.parent is not None and not math.isnan(node.parent):
            z += w["parent_draft_logit"] * _clipped_logit(node.parent)
        elif below > 0:
            z += w["parent_undrafted"]
        return -math.log1p(math.exp(-z)) if z >= 0 else z - math.log1p(math.exp(z))  # log sigmoid(z)

    def draft_worth(self, drafts: list[float], depth: int, parent: float | None = None) -> list[float]:
        """A level's draft guesses alone: the draft's log-probabilities at `depth` under a parent it gave `parent`
        (a log-probability; None at the root) -> their worth."""
        above = None if parent is None else math.exp(parent)
        return [self.worth(Evidence(depth, draft=math.exp(logp), parent=above)) for logp in drafts]

    def to_json(self) -> dict:
        return {"format": FORMAT, "weights": dict(self.named), "fitted": self.fitted}

    @classmethod
    def from_json(cls, data: dict, where: str = "tree_values.json") -> "TreeValues":
        """Read and check: a known format, exactly its features' weights, each finite (a first-format file's missing
        features weigh 0)."""
        names = FORMATS.get(data.get("format")) if isinstance(data, dict) else None
        if names is None:
            found = data.get("format") if isinstance(data, dict) else None
            raise ValueError(f"{where} is not a {FORMAT} file (format {found!r}): fit it again with `ppdkit "
                             "fit-tree-values`")
        weights = data.get("weights")
        if not isinstance(weights, dict) or set(weights) != set(names):
            got = sorted(weights) if isinstance(weights, dict) else weights
            raise ValueError(f"{where} must give a weight for each of {', '.join(names)}; it gives {got}")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in weights.values()):
            raise ValueError(f"{where} holds a weight that is not a finite number: {weights}")
        return cls(tuple(float(weights.get(name, 0.0)) for name in FEATURES), dict(data.get("fitted") or {}))


def fit(features: torch.Tensor, kept: torch.Tensor, l2: float = 1e-3) -> tuple[float, ...]:
    """Logistic regression: features [n, F], kept [n] (1: the node was the base's token, its parent having been) ->
    the weights, by L-BFGS on the mean log-loss plus l2 on every weight but the bias."""
    x, y = features.double(), kept.double()
    w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([w], max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ w, y) + l2 * (w[1:] ** 2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    return tuple(float(v) for v in w.detach())
