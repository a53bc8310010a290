"""Lookup drafting: chains of guesses copied from where the current text's ending occurred before, in
the context itself or in a corpus (the component's n-gram table, models/ngram_table.py).

The training-free drafters ppdkit draws on (Self-Draft's context cache, ANPD's
n-grams of the live context) rest on one fact: text, above all code, repeats itself. On a model's own
greedy answers the continuation of the longest earlier match of the last 1-3 tokens often gives the next
tokens after the root, on code most often (docs/history.md). A PPD step adds such chains as more
branches under its root, so the guesses of every source are verified in the same forward; acceptance
stays exact, so decoding stays lossless.
"""

from ppdkit.models.ngram_table import NgramTable

from ..trees.tree import TreeState

LOOKUP_RANK = 1 << 20  # the chain's rank: after every prompt-token guess in rank order (sampling tries those first)


class ContextIndex:
    """The text so far (prompt and output) and, for every 1..max_ngram-gram in it, where the token after
    its latest occurrence is: a lookup costs a few dict reads however long the text, where rescanning
    the text every step would cost time linear in it (the ANPD paper's n-gram pool of the live context)."""

    def __init__(self, tokens: list[int], max_ngram: int = 3):
        self.max_ngram = max_ngram
        self.tokens: list[int] = []
        self.follower: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after its latest occurrence
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            end = len(self.tokens)  # the n-grams ending just before `token` now have a follower: it
            for n in range(1, min(self.max_ngram, end) + 1):
                self.follower[tuple(self.tokens[end - n:end])] = end
            self.tokens.append(token)

    def continuation(self, length: int) -> list[int]:
        """The `length` tokens that followed the latest earlier occurrence of the longest suffix of the
        text (max_ngram down to 1); [] when the last token never occurred before. A continuation that runs
        into the text's end repeats itself: the text since that occurrence is read as a loop (the greedy
        output of a small model often is one)."""
        end = len(self.tokens)
        for n in range(min(self.max_ngram, end - 1), 0, -1):
            start = self.follower.get(tuple(self.tokens[end - n:]))  # the suffix itself has no follower yet
            if start is not None:
                found = self.tokens[start:start + length]
                return (found * -(-length // len(found)))[:length]
        return []


def draft_chains(context: ContextIndex, table: NgramTable | None, chains: int, length: int) -> list[list[int]]:
    """Up to `chains` distinct chains of exactly `length` tokens: the context's continuation first (it is
    `length` long or empty), then the table's for the same ending, cut to `length` (the table stores
    them `table.length` long, so it offers none for longer chains)."""
    table_chains = table.continuations(context.tokens) if table is not None and length <= table.length else []
    out: list[list[int]] = []
    for chain in [context.continuation(length)] + [c[:length] for c in table_chains]:
        if chain and chain not in out:
            out.append(chain)
    return out[:chains]


def with_lookup_chains(state: TreeState, chains: int, length: int) -> TreeState:
    """`state` plus `chains` chains of `length` nodes under the root that carry no prompt tokens."""
    parents, depths = list(state.parents), list(state.depths)
    for _ in range(chains):
        first = len(parents)
        parents += [0] + [first + i for i in range(length - 1)]
        depths += range(1, length + 1)
    added = chains * length
    return TreeState(tuple(parents), tuple(depths), state.ranks + (LOOKUP_RANK,) * added, state.prompts + (0,) * added)


def root_only(k: int) -> TreeState:
    """The state after a step that ended on a lookup node: no guesses, the root's k prompt tokens."""
    return TreeState((-1,), (0,), (-1,), (k,))
