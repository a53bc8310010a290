"""Fitting a grown tree's value model (runtime/trees/tree_values.py) for one component: decode held-out first turns of
the base model's corpus with the component's draft, keep every candidate of every step (the draft's proposals and the
chains' guesses, with what each source said of it), label each by the base model's own greedy answer, and fit the
logistic model on the candidates whose parent was right. The result ships in the component as tree_values.json.

Held out twice over: the prompts are the corpus's held-out conversations (data_pipeline/holdout.py's split, the one
continual training holds out, so the draft never trained on them), and the corpus's n-gram tables are built without
them, so the corpus chain cannot read the very answers it is judged on. MT-Bench, the adoption gate's measure, is never
read here.
"""

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from ppdkit.data_pipeline.corpus import open_corpus, stream_rows
from ppdkit.data_pipeline.holdout import CONTINUAL_HOLDOUT, CONTINUAL_HOLDOUT_SEED, split_holdout_by_id
from ppdkit.models.artifact import add_files, read_component
from ppdkit.runtime.drafters.corpus_ngrams import CorpusLookup, build_tables, corpus_digest
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.acceptance import Sampling
from ppdkit.runtime.answer_tokens import AnswerTokens
from ppdkit.runtime.decoding_methods import get_method
from ppdkit.runtime.trees.grown_tree import Proposals
from ppdkit.runtime.loop import decode
from ppdkit.runtime.trees.tree_values import TREE_VALUES, Evidence, TreeValues, evidence_rows, fit

log = logging.getLogger(__name__)


@dataclass
class Samples:
    """Candidates whose parent was the base model's token: their features [n, F] and whether each was too [n]."""

    features: list[torch.Tensor] = field(default_factory=list)
    kept: list[torch.Tensor] = field(default_factory=list)
    steps: int = 0

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat(self.features), torch.cat(self.kept)


def heldout_split(corpus_root: Path, count: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """(`count` held-out conversations' first-turn prompt ids, a seeded sample, or all of them in a corpus that holds
    out fewer; every other conversation's ids, for the n-gram tables)."""
    rows = list(stream_rows(open_corpus(corpus_root)))
    train, held = split_holdout_by_id(rows, CONTINUAL_HOLDOUT, CONTINUAL_HOLDOUT_SEED)
    held = [r for r in held if r.answer_spans]
    if not held:
        raise ValueError(f"the corpus at {corpus_root} holds out no conversation with an answer: grow it "
                         "(ppdkit corpus grow)")
    if len(held) < count:
        log.warning("the corpus at %s holds out %d conversations: fitting on all of them, not %d", corpus_root,
                    len(held), count)
    picked = random.Random(seed).sample(held, min(count, len(held)))
    return [r.input_ids[:r.answer_spans[0][0]] for r in picked], [r.input_ids for r in train]


def label(candidates: Proposals, evidence: list[Evidence], truth: list[int], samples: Samples) -> None:
    """Add a step's candidates whose parent was right (truth: the base model's tokens after the root) to `samples`."""
    right = []  # per candidate: its path equals truth's first tokens
    rows = []
    for i, (parent, depth, token) in enumerate(zip(candidates.parents, candidates.depths, candidates.tokens)):
        parent_right = parent < 0 or right[parent]
        right.append(parent_right and depth <= len(truth) and truth[depth - 1] == token)
        if parent_right and depth <= len(truth):
            rows.append(i)
    if rows:
        samples.features.append(evidence_rows([evidence[i] for i in rows]))
        samples.kept.append(torch.tensor([float(right[i]) for i in rows]))


def record(decoder: Decoder, prompts: list[list[int]], method: str, max_new_tokens: int) -> Samples:
    """Decode each prompt greedily with `method` (a grown-tree method), keeping every step's candidates, then label
    them by the answer. A step near the answer's end whose deepest candidate would reach past it is left out, unless
    the answer ended with an end token (then what follows is known: nothing)."""
    samples = Samples()
    for ids in tqdm(prompts, desc="tree values: held-out decoding", unit="prompt"):
        steps: list[tuple[int, Proposals, list[Evidence]]] = []
        answer = AnswerTokens(max_new_tokens, decoder.eos_ids())
        with torch.inference_mode():
            drafter = decoder.new_drafter(method, len(ids), max_new_tokens)
            drafter.observe = lambda merged, evidence: steps.append((len(answer.tokens), merged, evidence))
            decode(drafter, torch.tensor(ids), answer.add, Sampling(), None)
        ended = bool(answer.tokens) and answer.tokens[-1] in decoder.eos_ids()
        for emitted, merged, evidence in steps:
            truth = answer.tokens[emitted:]  # the root is answer.tokens[emitted - 1]
            if not ended and len(truth) < max(merged.depths, default=0):
                continue
            label(merged, evidence, truth, samples)
            samples.steps += 1
    return samples


HELD_OUT_PROMPTS = 64  # the first turns a fit decodes unless told otherwise


def fit_tree_values(component: Path, corpus_root: Path, prompts: int = HELD_OUT_PROMPTS,
                    method: str = "eagle3-corpus", dtype: str = "float32", max_new_tokens: int = 128, seed: int = 0,
                    write: bool = True) -> TreeValues:
    """Fit the value model of `component`'s grown trees on `prompts` held-out corpus first turns, and (`write`) add it
    to the component as tree_values.json (replacing one there: the fit runs without it, on the draft's own values)."""
    if not get_method(method).grown:
        raise ValueError(f"{method} does not grow its trees: fit tree values with eagle3-corpus, eagle3-anpd, eagle3 "
                         "or a feature-grown method")
    decoder = Decoder.from_pretrained(component, dtype=dtype, tree_size=8)
    made_by = open_corpus(corpus_root).manifest.get("fingerprint")
    if made_by != decoder.fingerprint:
        raise ValueError(f"the corpus at {corpus_root} was written by another base model (fingerprint {made_by}) than "
                         f"{component}'s ({decoder.fingerprint}): give the corpus of its base model (--corpus)")
    held, train = heldout_split(corpus_root, prompts, seed)
    # the corpus chain reads tables without the held-out rows: it must not find the answers it is judged on
    decoder.draft.corpus = CorpusLookup(None, build_tables(tqdm(train, desc="corpus n-grams without the held-out rows",
                                                                unit="row")))
    decoder.draft.tree_values = None  # fitted on the draft's own values, whatever the component holds now
    samples = record(decoder, held, method, max_new_tokens)
    features, kept = samples.tensors()
    weights = fit(features, kept)
    fitted = {"method": method, "dtype": dtype, "max_new_tokens": max_new_tokens, "prompts": len(held), "seed": seed,
              "heldout": {"fraction": CONTINUAL_HOLDOUT, "seed": CONTINUAL_HOLDOUT_SEED}, "steps": samples.steps,
              "candidates": len(kept), "kept": int(kept.sum()), "corpus": corpus_digest(corpus_root)[:16]}
    values = TreeValues(weights, fitted)
    log.info("tree values of %s: %d candidates of %d steps, weights %s", component.name, len(kept), samples.steps,
             ", ".join(f"{w:.3f}" for w in weights))
    if write:
        # checked again before add_files re-hashes every listed file: a file changed during the fit is refused, not
        # written into component.json as if it were the one trained
        read_component(component)
        add_files(component, json_files={TREE_VALUES: values.to_json()})
    return values
