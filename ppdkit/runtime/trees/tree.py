"""Dynamic sparse trees (PPD thesis chapter 5): which guesses to verify, and how many prompt tokens each gets.

Inputs are acceptance probabilities p[d][r]: how often the rank-r guess of the prompt token at distance
d+1 is the token greedy decoding produces, measured on held-out data. A tree has one state per number
of available guess distances k (= the prompt tokens on the node accepted last step):
- candidate tree of state k (prop. 5.6.1): the n_c most probable guess paths of depth <= k, which
  maximizes f(T_k), the expected number of accepted guesses;
- prompt tokens: every node (root included) starts with m; they are removed one at a time where the
  loss dF = p_final(c) * (f(T_i) - f(T_{i-1})) is smallest (prop. 5.6.3) until n_p remain;
- R(T) = sum_k pi_k f(T_k) with pi the steady state of the state chain (prop. 5.6.4); a step then
  yields tau = R + 1 tokens on average (the verified guesses plus the base model's own next token).
"""

import heapq
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TreeState:
    """Node 0 is the root (the token decoded last step); nodes 1.. are guesses, parents before children."""

    parents: tuple[int, ...]  # parent node of each node (-1 for the root)
    depths: tuple[int, ...]  # 0 for the root, d for a guess at distance d
    ranks: tuple[int, ...]  # which guess at its distance (0 = the most likely); -1 for the root
    prompts: tuple[int, ...]  # prompt tokens appended to each node, >= 1

    @property
    def candidates(self) -> int:
        return len(self.parents) - 1


@dataclass
class DynamicTree:
    states: dict[int, TreeState]  # k -> tree used when k guess distances are available
    f: dict[int, float]  # expected accepted guesses per state
    steady: dict[int, float]  # steady-state probability of each state
    tau: float  # expected tokens per step
    size: int = 0  # input tokens of the largest state (nodes + prompt slots)
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"tau": self.tau, "size": self.size, "meta": self.meta,
                "states": {str(k): {"parents": list(s.parents), "depths": list(s.depths), "ranks": list(s.ranks),
                                    "prompts": list(s.prompts), "f": self.f[k], "steady": self.steady[k]}
                           for k, s in self.states.items()}}

    @classmethod
    def from_json(cls, data: dict) -> "DynamicTree":
        try:
            states = {int(k): TreeState(tuple(v["parents"]), tuple(v["depths"]), tuple(v["ranks"]),
                                        tuple(v["prompts"])) for k, v in data["states"].items()}
            return cls(states, {int(k): v["f"] for k, v in data["states"].items()},
                       {int(k): v["steady"] for k, v in data["states"].items()}, data["tau"], data["size"], data["meta"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"not a dynamic tree ({type(e).__name__}: {e})") from None

    def check(self, num_prompt_tokens: int, max_rank: int) -> None:
        """Raise ValueError unless every state is a tree a decoder can walk: state k (1..m) guesses at
        distances 1..k, parents come before their children, ranks index the guesses kept per distance,
        and each node's prompt tokens name a state of this tree."""
        if sorted(self.states) != list(range(1, num_prompt_tokens + 1)):
            raise ValueError(f"states {sorted(self.states)}, expected 1..{num_prompt_tokens} (one per prompt-token count)")
        for k, s in self.states.items():
            n = len(s.parents)
            if not n or len(s.depths) != n or len(s.ranks) != n or len(s.prompts) != n:
                raise ValueError(f"state {k}: parents, depths, ranks and prompts differ in length")
            try:
                check_nodes(s.parents, s.depths, s.ranks, k, max_rank)
            except ValueError as e:
                raise ValueError(f"state {k}: {e}") from None
            if any(not 1 <= c <= num_prompt_tokens for c in s.prompts):
                raise ValueError(f"state {k}: prompt tokens per node must be 1..{num_prompt_tokens}, got {s.prompts}")


def check_nodes(parents, depths, ranks, max_depth: int, max_rank: int) -> None:
    """Raise ValueError unless node 0 is the root, every other node is a child of an earlier one within
    `max_depth`, and its rank indexes one of `max_rank` guesses (parents, depths, ranks equally long)."""
    if parents[0] != -1 or depths[0] != 0:
        raise ValueError("node 0 must be the root (parent -1, depth 0)")
    for node in range(1, len(parents)):
        parent = parents[node]
        if not 0 <= parent < node or depths[node] != depths[parent] + 1 or depths[node] > max_depth:
            raise ValueError(f"node {node} (parent {parent}, depth {depths[node]}) is not a child of an earlier node "
                             f"within distance {max_depth}")
        if not 0 <= ranks[node] < max_rank:
            raise ValueError(f"node {node} has rank {ranks[node]}, outside 0..{max_rank - 1}")


def candidate_tree(p: list[list[float]], max_depth: int, n: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """The n most probable guess paths of depth <= max_depth: (parents, depths, ranks, path probabilities).

    A child's path probability never exceeds its parent's, so taking paths best-first always finds the
    parent already in the tree; the result maximizes f = sum of path probabilities for its size.
    """
    parents, depths, ranks, probs = [-1], [0], [-1], [1.0]
    heap: list[tuple[float, int, int, int]] = []  # (-prob, tie-break, parent node, rank)
    counter = 0

    def push_children(node: int) -> None:
        nonlocal counter
        d = depths[node]
        if d >= max_depth or d >= len(p):
            return
        for r, q in enumerate(p[d]):
            if q > 0:
                heapq.heappush(heap, (-probs[node] * q, counter, node, r))
                counter += 1

    push_children(0)
    while heap and len(parents) <= n:
        neg, _, parent, r = heapq.heappop(heap)
        parents.append(parent)
        depths.append(depths[parent] + 1)
        ranks.append(r)
        probs.append(-neg)
        push_children(len(parents) - 1)
    return parents, depths, ranks, probs


def final_probabilities(parents: list[int], depths: list[int], ranks: list[int], probs: list[float],
                        p: list[list[float]]) -> list[float]:
    """P(node is the deepest accepted one) = P(its path) * (1 - sum of its children's hit rates)."""
    child_hit = [0.0] * len(parents)
    for node in range(1, len(parents)):
        child_hit[parents[node]] += p[depths[node] - 1][ranks[node]]
    return [probs[i] * max(0.0, 1.0 - child_hit[i]) for i in range(len(parents))]


def allocate_prompts(final: list[float], f_by_state: dict[int, float], m: int, n_prompts: int) -> list[int]:
    """Start every node at m prompt tokens; remove the cheapest (prop. 5.6.3) until n_prompts remain."""
    prompts = [m] * len(final)
    heap = [(final[i] * (f_by_state[m] - f_by_state[m - 1]), i) for i in range(len(final)) if m > 1]
    heapq.heapify(heap)
    total = m * len(final)
    while total > n_prompts and heap:
        _, i = heapq.heappop(heap)
        prompts[i] -= 1
        total -= 1
        if prompts[i] > 1:
            c = prompts[i]
            heapq.heappush(heap, (final[i] * (f_by_state[c] - f_by_state[c - 1]), i))
    return prompts


def steady_state(transition: dict[int, dict[int, float]], iterations: int = 500) -> dict[int, float]:
    states = sorted(transition)
    pi = {k: 1.0 / len(states) for k in states}
    for _ in range(iterations):
        nxt = {k: 0.0 for k in states}
        for a in states:
            for b, prob in transition[a].items():
                nxt[b] += pi[a] * prob
        total = sum(nxt.values()) or 1.0
        pi = {k: v / total for k, v in nxt.items()}
    return pi


def build_dynamic_tree(p: list[list[float]], n_candidates: int, n_prompts: int) -> DynamicTree:
    """The dynamic sparse tree with at most n_candidates guesses and n_prompts prompt tokens per state."""
    m = len(p)
    trees = {k: candidate_tree(p, k, n_candidates) for k in range(1, m + 1)}
    f = {k: sum(t[3][1:]) for k, t in trees.items()}
    f[0] = 0.0
    states, transition = {}, {}
    for k, (parents, depths, ranks, probs) in trees.items():
        final = final_probabilities(parents, depths, ranks, probs, p)
        budget = max(n_prompts, len(parents))  # every node keeps at least one prompt token
        prompts = allocate_prompts(final, f, m, budget)
        states[k] = TreeState(tuple(parents), tuple(depths), tuple(ranks), tuple(prompts))
        row: dict[int, float] = {}
        for node, q in enumerate(final):
            row[prompts[node]] = row.get(prompts[node], 0.0) + q
        transition[k] = row
    pi = steady_state(transition)
    tau = 1.0 + sum(pi[k] * f[k] for k in states)
    return DynamicTree(states, {k: f[k] for k in states}, pi, tau)


def tree_input_size(state: TreeState, epts: int) -> int:
    return len(state.parents) + sum(state.prompts) * epts


def best_tree_for_size(p: list[list[float]], size: int, epts: int = 1) -> DynamicTree:
    """Among splits of `size` input tokens into guesses and prompt tokens, the one with the highest tau."""
    m = len(p)
    best = None
    for n_c in range(0, size):
        n_p = (size - 1 - n_c) // epts
        if n_p < n_c + 1:
            break
        tree = build_dynamic_tree(p, n_c, n_p)
        tree.size = max(tree_input_size(s, epts) for s in tree.states.values())
        if tree.size > size:
            continue
        if best is None or tree.tau > best.tau + 1e-12:
            best = tree
    if best is None:
        raise ValueError(f"no tree fits {size} input tokens with {m} prompt tokens of {epts} EPTs (need >= {1 + epts})")
    best.meta = {"budget": size, "candidates": max(s.candidates for s in best.states.values()),
                 "epts": epts}
    return best
