"""Guesses from the base model's own corpus: what most often followed the longest ending of the text that the
self-distilled corpus (data_pipeline/corpus.py, committed for the base model) holds, as a chain merged into a
grown tree beside the draft's guesses and ANPD's chain of the live text (`eagle3-corpus`).

The corpus is the model's own greedy answers, so where a chat answer says what many answers before it said (the
phrasing of a list, a greeting, a code idiom), the corpus knows the next tokens that a draft of one layer may not.
What it adds to eagle3-anpd's tree on the adoption gate's measure: docs/corpus.md (docs/tools/corpus_chain.py).

The table: for each n in 1..max_n, every n-token context of the corpus's texts and its most frequent follower, as one
sorted uint64 array per n: a 48-bit hash of the context over the follower's 16 bits (ids of up to 65,536 tokens; a
hash collision only makes a guess that verification rejects), beside it that follower's share of the context's
occurrences. A lookup is a binary search per n, longest first. Built once per corpus version (its manifest's sha256)
into the cache directory, with a progress bar: seconds for a corpus of millions of tokens.
"""

import hashlib
import logging
import math
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAX_N = 6  # contexts of up to 6 tokens: up to 10 agreed with MT-Bench's next tokens hardly more often
CHAIN_LENGTH = 7  # guesses a chain drafts, as ANPD's
SHARE_BUCKETS = 4  # a guess's kind: its context length and its share of the context's followers, in quarters
TOKEN_BITS = 16  # a follower's bits in a table entry; the context's hash has the other 48
_MUL = 0x9E3779B97F4A7C15  # a 64-bit odd multiplier (the golden ratio's): a context's hash h <- (h + token + 1) * MUL,
# whose top bits (the ones kept) depend on every token
_MASK = (1 << 64) - 1
_END = -1  # between texts in the stream: no context spans it, no text's last token has a follower
FORMAT = "ppdkit-corpus-ngrams/2"


@dataclass
class CorpusNgrams:
    """tables[n - 1]: sorted uint64 [M_n], (hash of an n-token context << 16) | its most frequent follower;
    shares[n - 1]: uint8 [M_n], that follower's share of the context's occurrences (x 255, rounded down)."""

    tables: list[np.ndarray]
    shares: list[np.ndarray]

    @property
    def max_n(self) -> int:
        return len(self.tables)

    @property
    def kinds(self) -> int:
        """How many kinds of guess a chain tells apart: by context length and the follower's share."""
        return self.max_n * SHARE_BUCKETS

    def query(self, text: list[int]) -> tuple[int, int] | None:
        """(the follower, its kind) of the longest ending of `text` of at most max_n tokens that the corpus holds;
        kind = (n - 1) * SHARE_BUCKETS + the share's bucket."""
        for n in range(min(self.max_n, len(text)), 0, -1):
            context = context_hash(text[-n:])
            table = self.tables[n - 1]
            i = int(np.searchsorted(table, np.uint64(context << TOKEN_BITS)))  # its first follower entry, if any
            if i < len(table) and int(table[i]) >> TOKEN_BITS == context:
                bucket = int(self.shares[n - 1][i]) * SHARE_BUCKETS // 256
                return int(table[i]) & ((1 << TOKEN_BITS) - 1), (n - 1) * SHARE_BUCKETS + bucket
        return None

    def draft(self, text: list[int], length: int = CHAIN_LENGTH,
              known: dict[tuple[int, ...], tuple[int, int] | None] | None = None) -> tuple[list[int], list[int]]:
        """Up to `length` guesses after `text`, each read with the ones before it, and each one's kind (fewer
        guesses when no ending is known). known: the queries' answers by their last max_n tokens (all a query reads),
        filled in as they are asked: a step whose chain was right asks most of the last step's queries again."""
        tail, chain, kinds = tuple(text[-self.max_n:]), [], []
        while len(chain) < length:
            if known is None:
                found = self.query(list(tail))
            elif (found := known.get(tail, False)) is False:
                found = known[tail] = self.query(list(tail))
            if found is None:
                break
            chain.append(found[0])
            kinds.append(found[1])
            tail = (*tail, found[0])[-self.max_n:]
        return chain, kinds


def context_hash(tokens: list[int]) -> int:
    """The 48-bit hash of a context (64 - TOKEN_BITS bits), as build_tables computes it for the corpus's."""
    h = 0
    for token in tokens:
        h = ((h + token + 1) * _MUL) & _MASK
    return h >> TOKEN_BITS


def build_tables(texts: Iterable[list[int]], max_n: int = MAX_N, progress=None) -> CorpusNgrams:
    """Every n-token context (n <= max_n) of the texts and its most frequent follower (ties: the smallest id)."""
    stream = np.concatenate([np.array([*t, _END], dtype=np.int64) for t in texts] or [np.zeros(0, np.int64)])
    if len(stream) and stream.max() >= 1 << TOKEN_BITS:
        raise ValueError(f"corpus n-grams hold token ids below {1 << TOKEN_BITS}; this corpus has {stream.max()}")
    count = len(stream)
    h = np.zeros(count, dtype=np.uint64)  # [T] the hash of the n tokens from each position
    crosses = np.zeros(count, dtype=bool)  # [T] the n tokens from the position hold a text's end
    shifted = (stream + 1).astype(np.uint64)
    tables, shares = [], []
    with np.errstate(over="ignore"):
        for n in range(1, max_n + 1):
            valid = max(count - n, 0)  # contexts with a follower after them
            h[:valid] = (h[:valid] + shifted[n - 1:n - 1 + valid]) * np.uint64(_MUL)
            crosses[:valid] |= stream[n - 1:n - 1 + valid] == _END
            follower = stream[n:n + valid]
            keep = ~crosses[:valid] & (follower != _END)
            pairs = np.sort((h[:valid][keep] >> np.uint64(TOKEN_BITS) << np.uint64(TOKEN_BITS))
                            | follower[keep].astype(np.uint64))  # [P] (context, follower), grouped by context
            best, share = most_frequent(pairs)
            tables.append(best)
            shares.append(share)
            if progress is not None:
                progress(n)
    return CorpusNgrams(tables, shares)


def most_frequent(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (context << 16 | follower) pairs, one per occurrence [P] -> one pair per context, its most frequent
    follower's [M] (ties: the smallest id, the first in sorted order), and that follower's share of the context's
    occurrences, uint8 [M] (x 255, rounded down)."""
    if len(pairs) == 0:
        return pairs, np.zeros(0, dtype=np.uint8)
    starts = np.flatnonzero(np.r_[True, pairs[1:] != pairs[:-1]])  # each distinct pair's first index
    distinct, counts = pairs[starts], np.diff(np.r_[starts, len(pairs)])  # [D]
    context = distinct >> np.uint64(TOKEN_BITS)
    order = np.lexsort((-counts, context))  # by context, the most frequent follower first
    distinct, context, counts = distinct[order], context[order], counts[order]
    first = np.flatnonzero(np.r_[True, context[1:] != context[:-1]])  # [M] each context's first (best) pair
    totals = np.add.reduceat(counts, first)  # [M] the context's occurrences
    return distinct[first], (counts[first] * 255 // totals).astype(np.uint8)


def corpus_digest(root: Path) -> str:
    """What a table is built from: the corpus's manifest (every shard's sha256 is in it)."""
    return hashlib.sha256((root / "corpus.json").read_bytes()).hexdigest()


_PREFETCHED: dict[tuple[Path, int], Future] = {}  # tables being read or built in a thread (prefetch_corpus_ngrams)


def prefetch_corpus_ngrams(root: Path, max_n: int = MAX_N) -> None:
    """Start reading or building the tables of the corpus at `root` in a thread, so that a first decode's model
    conversion and load overlap the build (sorting releases the GIL); load_corpus_ngrams then waits for it."""
    key = (Path(root).resolve(), max_n)
    if key not in _PREFETCHED:
        _PREFETCHED[key] = ThreadPoolExecutor(1, thread_name_prefix="corpus-ngrams").submit(_read_or_build, root, max_n)


def load_corpus_ngrams(root: Path, max_n: int = MAX_N) -> CorpusNgrams:
    """The tables of the corpus at `root`, read from the cache or built there once for this corpus version (or what a
    prefetch of them read or built)."""
    prefetched = _PREFETCHED.pop((Path(root).resolve(), max_n), None)
    return prefetched.result() if prefetched is not None else _read_or_build(root, max_n)


def _read_or_build(root: Path, max_n: int) -> CorpusNgrams:
    from safetensors.numpy import load_file, save_file
    from tqdm import tqdm

    from ppdkit.data_pipeline.corpus import open_corpus, read_rows
    from ppdkit.models.paths import cache_dir

    version = FORMAT.rsplit("/", 1)[1]  # a table of another format is another file, built anew
    digest = corpus_digest(root)
    path = cache_dir() / "corpus-ngrams" / f"{root.name}-{digest[:16]}-n{max_n}-v{version}.safetensors"
    if path.is_file():
        stored = load_file(str(path))
        return CorpusNgrams([stored[f"n{n}"] for n in range(1, max_n + 1)],
                            [stored[f"share{n}"] for n in range(1, max_n + 1)])
    rows = read_rows(open_corpus(root))
    with tqdm(total=max_n, desc=f"corpus n-grams of {root.name} (once per corpus version)", unit="n") as bar:
        built = build_tables((r.input_ids for r in rows), max_n, lambda n: bar.update())
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")  # renamed once whole: a stopped build leaves no table to misread
    save_file({**{f"n{n + 1}": t for n, t in enumerate(built.tables)},
               **{f"share{n + 1}": t for n, t in enumerate(built.shares)}}, str(partial),
              metadata={"format": FORMAT, "corpus": digest})
    partial.replace(path)
    log.info("corpus n-grams of %s: %d contexts, kept in %s", root.name, sum(map(len, built.tables)), path)
    return built


@dataclass
class CorpusLookup:
    """A corpus's n-gram tables, read on first use (a decoder that never runs a corpus method never builds them)."""

    root: Path | None  # None: the tables were given, not read
    _table: CorpusNgrams | None = field(default=None, repr=False)

    @property
    def table(self) -> CorpusNgrams:
        if self._table is None:
            self._table = load_corpus_ngrams(self.root)
        return self._table


class CorpusChain:
    """A chain of guesses from the corpus for one answer, and how often a guess of each kind (its context length and
    share, CorpusNgrams.query) was the base model's token once its predecessors were (each starts at 1 of 2): a
    guess's value is the log of the product of those rates along the chain, so a long, one-sided context outweighs a
    short or split one by what it earned."""

    def __init__(self, table: CorpusNgrams, ids: list[int], length: int = CHAIN_LENGTH):
        self.table, self.text, self.length = table, list(ids), length
        self.right, self.tried = [1.0] * table.kinds, [2.0] * table.kinds
        self.kinds: list[int] = []  # the kind of each guess of the last chain
        self.known: dict[tuple[int, ...], tuple[int, int] | None] = {}  # this answer's queries (CorpusNgrams.draft)

    def draft(self, root: int) -> list[int]:
        self.text.append(root)
        chain, self.kinds = self.table.draft(self.text, self.length, self.known)
        return chain

    def values(self) -> list[float]:
        """The last chain's guesses' log-values."""
        return [float(v) for v in np.cumsum([math.log(rate) for rate in self.rates()])]

    def rates(self) -> list[float]:
        """The last chain's guesses' running rates, each given the guesses before it."""
        return [self.right[k] / self.tried[k] for k in self.kinds]

    def update(self, chain: list[int], accepted: list[int], next_token: int) -> None:
        """Score the chain against the base model's tokens of this step, whether or not the tree held it."""
        for guess, kind, token in zip(chain, self.kinds, accepted + [next_token]):
            self.tried[kind] += 1
            if guess != token:
                break
            self.right[kind] += 1
        self.text.extend(accepted)
