"""A grown tree's fitted value model (ppdkit/runtime/trees/tree_values.py, ppdkit/trainer/tree_values_fit.py): the file
is checked as it is read, the fit recovers a known model, the candidates merge every source's guesses with what each
said, a node is never worth more than its parent, labels follow the base model's answer, and decoding with any value
model (a fitted one, one that ranks the worst guesses first) stays the base model's greedy output."""

import math
import random

import pytest
import torch
from conftest import tiny_model_on
from test_corpus_ngrams import _greedy_texts
from test_draft_heads import VOCAB
from test_eagle3 import _decoder, _draft_tensors

from ppdkit.models.artifact import ArtifactError, read_component, write_component
from ppdkit.runtime.drafters.corpus_ngrams import CorpusLookup, build_tables
from ppdkit.runtime.decoder_loading import tree_values
from ppdkit.runtime.trees.grown_tree import Proposals, by_value, candidates, value_candidates
from ppdkit.runtime.trees.tree_values import FEATURES, Evidence, TreeValues, evidence_rows, fit
from ppdkit.trainer.tree_values_fit import Samples, label, record

FITTED = TreeValues((-1.4, 1.4, 1.0, 0.0, 0.65, 0.45, 0.55, 1.1, 0.55, 0.02, -0.25, 0.2, 0.35, -0.07, 0.8),
                    {})  # near the SmolLM2 draft's fit


def test_the_file_round_trips_and_bad_files_are_refused_with_the_fix(tmp_path):
    data = FITTED.to_json()
    assert TreeValues.from_json(data) == FITTED
    with pytest.raises(ValueError, match="ppdkit-tree-values/2.*fit-tree-values"):
        TreeValues.from_json({**data, "format": "other/9"})
    # the first format's file: its ten weights, the features it lacks at 0, so it values every node as it did
    first = {"format": "ppdkit-tree-values/1", "weights": dict(zip(FEATURES[:10], FITTED.weights))}
    assert TreeValues.from_json(first).weights == FITTED.weights[:10] + (0.0,) * (len(FEATURES) - 10)
    with pytest.raises(ValueError, match="weight for each of bias"):
        TreeValues.from_json({**first, "weights": data["weights"]})  # a second-format file's weights, mislabelled
    with pytest.raises(ValueError, match="weight for each of bias"):
        TreeValues.from_json({**data, "weights": {k: v for k, v in data["weights"].items() if k != "depth"}})
    with pytest.raises(ValueError, match="not a finite number"):
        TreeValues.from_json({**data, "weights": {**data["weights"], "chain": math.nan}})
    # in a component: read with its checksum, refused (naming the file) when it is damaged
    write_component(tmp_path / "c", "eagle3", {}, "tiny", "fp", {}, {"w": torch.zeros(1)},
                    extras={"tree_values": {**data, "weights": {"bias": 1.0}}})
    with pytest.raises(ArtifactError, match="tree_values.json must give a weight for each"):
        tree_values(read_component(tmp_path / "c"))
    write_component(tmp_path / "d", "eagle3", {}, "tiny", "fp", {}, {"w": torch.zeros(1)}, extras={"tree_values": data})
    assert tree_values(read_component(tmp_path / "d")) == FITTED
    write_component(tmp_path / "e", "eagle3", {}, "tiny", "fp", {}, {"w": torch.zeros(1)})
    assert tree_values(read_component(tmp_path / "e")) is None


def test_the_fit_recovers_the_model_that_labelled_the_samples():
    g = torch.Generator().manual_seed(0)
    truth = torch.tensor([-1.0, 0.8, 1.2, -0.3, 0.6, 0.5, 0.9, 1.1, 0.4, 0.3, -0.4, 0.2, 0.35, 0.3, 0.7],
                         dtype=torch.float64)
    nodes = []
    for i in range(30000):
        depth = random.Random(i).randint(1, 5)
        nodes.append(Evidence(depth=depth, draft=None if i % 5 == 0 else float(torch.rand(1, generator=g)),
                              corpus=float(torch.rand(1, generator=g)) if i % 3 == 0 else None,
                              chain=float(torch.rand(1, generator=g)) if i % 4 == 0 else None,
                              parent=float(torch.rand(1, generator=g)) if depth > 1 and i % 7 else None))
    x = evidence_rows(nodes).double()
    kept = (torch.rand(len(nodes), generator=g, dtype=torch.float64) < torch.sigmoid(x @ truth)).double()
    weights = torch.tensor(fit(x, kept, l2=0.0), dtype=torch.float64)
    assert torch.allclose(weights, truth, atol=0.15), weights
    assert len(weights) == len(FEATURES)


def test_a_nodes_worth_in_python_is_the_fitted_models_number_for_its_features():
    """A grown tree values its nodes in Python (worth, draft_worth); the fitted model's own numbers for the same
    evidence (log_worth of evidence_rows, as the fit reads it), for every mix of sources and probabilities: 0 and 1
    are clipped, not infinite."""
    rng = random.Random(0)
    probabilities = [None, 0.0, 1e-12, 0.01, 0.3, 0.55, 1 - 1e-12, 1.0]
    nodes = [Evidence(depth=rng.randint(1, 6), draft=rng.choice(probabilities), corpus=rng.choice(probabilities),
                      chain=rng.choice(probabilities), parent=rng.choice(probabilities)) for _ in range(400)]
    expected = FITTED.log_worth(evidence_rows(nodes)).tolist()
    assert [FITTED.worth(node) for node in nodes] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    logps = [-math.inf, -30.0, math.log(0.01), math.log(0.3), math.log(0.55), -1e-9, 0.0]
    for depth, parent in ((1, None), (2, None), (2, math.log(0.7)), (5, -30.0)):
        above = None if parent is None else math.exp(parent)
        rows = evidence_rows([Evidence(depth=depth, draft=math.exp(lp), parent=above) for lp in logps])
        assert FITTED.draft_worth(logps, depth, parent) == pytest.approx(FITTED.log_worth(rows).tolist(), rel=1e-5,
                                                                         abs=1e-6)
    assert FITTED.draft_worth([math.log(0.6)], 1)[0] > FITTED.draft_worth([math.log(0.3)], 1)[0]


def test_candidates_merge_every_sources_guesses_and_value_them_below_their_parents():
    found = Proposals()
    a = found.add(math.log(0.6), 1, 10, -1, math.log(0.6))
    found.add(math.log(0.3), 1, 11, -1, math.log(0.3))
    found.add(math.log(0.6 * 0.5), 2, 12, a, math.log(0.5))
    merged, evidence = candidates(found, [([10, 12, 13], [0.4, 0.4, 0.4], "chain"), ([11, 14], [0.9, 0.5], "corpus")])
    paths = {(merged.parents[i], merged.tokens[i]): evidence[i] for i in range(len(merged.tokens))}
    assert len(merged.tokens) == 5  # 10, 11, 12 the draft's; 13 (under 12) and 14 (under 11) the chains'
    assert paths[(-1, 10)] == Evidence(depth=1, draft=pytest.approx(0.6), chain=0.4)
    assert paths[(-1, 11)] == Evidence(depth=1, draft=pytest.approx(0.3), corpus=0.9)
    assert paths[(0, 12)] == Evidence(depth=2, draft=pytest.approx(0.5), chain=0.4, parent=pytest.approx(0.6))
    assert paths[(2, 13)] == Evidence(depth=3, chain=0.4, parent=pytest.approx(0.5))  # what the draft said of 12
    assert paths[(1, 14)] == Evidence(depth=2, corpus=0.5, parent=pytest.approx(0.3))
    assert all(p < i for i, p in enumerate(merged.parents))  # parents first
    value_candidates(merged, evidence, FITTED)
    assert all(merged.values[i] < (merged.values[p] if p >= 0 else 0.0) for i, p in enumerate(merged.parents))
    # agreement pays: the draft's 0.3 with the corpus's 0.9 outranks the draft's 0.6 with the chain's 0.4 here
    assert by_value(merged, 1) == [1]


def test_labels_follow_the_answer_below_right_parents_only():
    merged = Proposals()
    for value, depth, token, parent in ((0, 1, 5, -1), (0, 1, 6, -1), (0, 2, 7, 0), (0, 2, 8, 1), (0, 3, 9, 2)):
        merged.add(value, depth, token, parent)
    evidence = [Evidence(depth=d, draft=0.5) for d in merged.depths]
    samples = Samples()
    label(merged, evidence, [5, 7, 1], samples)  # 5 right, 6 wrong; 7 right under 5; 8 under a wrong 6; 9 wrong
    features, kept = samples.tensors()
    assert kept.tolist() == [1.0, 0.0, 1.0, 0.0] and features[:, FEATURES.index("depth")].tolist() == [0, 0, 1, 2]
    label(merged, evidence, [5], samples)  # the answer ended after 5: nothing deeper is labelled
    assert samples.tensors()[1].tolist()[4:] == [1.0, 0.0]


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_decoding_with_any_value_model_is_the_base_models_greedy_output(path, monkeypatch):
    """A fitted model, and models that rank the drafts' least likely guesses first or value everything the same:
    the tree changes, the tokens do not; a model fitted on this draft's own decoding keeps at least as many a step
    as the draft's own values on these prompts."""
    model, tok = tiny_model_on(path, monkeypatch)
    rng = random.Random(3)
    vocab = torch.arange(3, VOCAB, 3)
    decoder = _decoder(model, tok, _draft_tensors(model, vocab, 0, scale=0.5), vocab)
    prompts, answered = _greedy_texts(decoder, rng, 8)
    decoder.draft.corpus = CorpusLookup(None, build_tables(answered))
    plain = [decoder.generate(ids, max_new_tokens=32, method="ar").tokens for ids in prompts[:4]]
    samples = record(decoder, prompts[4:], "eagle3-corpus", 32)
    assert samples.steps > 0 and 0 < samples.tensors()[1].mean() < 1
    inverted = TreeValues(tuple(-w for w in FITTED.weights), {})
    flat = TreeValues((0.0,) * len(FEATURES), {})
    steps = {}
    for name, values in (("own", None), ("fitted", TreeValues(fit(*samples.tensors()), {})), ("inverted", inverted),
                         ("flat", flat)):
        decoder.draft.tree_values = values
        steps[name] = 0
        for ids, want in zip(prompts[:4], plain):
            for method in ("eagle3-anpd", "eagle3-corpus"):
                out = decoder.generate(ids, max_new_tokens=32, method=method)
                assert out.tokens == want, (name, method, ids)
                steps[name] += out.steps * (method == "eagle3-corpus")
    assert steps["inverted"] > steps["own"] and steps["fitted"] <= steps["own"], steps


def test_fit_tree_values_writes_a_checked_file_into_the_component(tmp_path):
    """The whole fit on a tiny corpus (the base model's greedy answers) and component: held-out first turns decoded
    with tables that lack them, the file added to component.json with its checksum, and read back by the loader; a
    corpus of another base model is refused."""
    from test_adopt import _component

    from ppdkit.data_pipeline.corpus import CorpusRow, append_shard, create_corpus
    from ppdkit.jobs.adopt import adopt
    from ppdkit.models.loading import load_base_model
    from ppdkit.runtime.decoder import Decoder
    from ppdkit.trainer.tree_values_fit import fit_tree_values, heldout_split

    base = load_base_model("tiny-llama")
    component = _component(tmp_path / "draft", base, scale=0.5)
    plain = Decoder.from_pretrained(component, dtype="float32")
    rng = random.Random(4)
    rows = []
    for i in range(300):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 6))]
        answer = plain.generate(prompt, max_new_tokens=16, method="ar").tokens
        rows.append(CorpusRow(id=f"r{i}", source="chitchat", input_ids=prompt + answer,
                              answer_spans=[(len(prompt), len(prompt) + len(answer))], seed=0, temperature=0.0,
                              prompt_temperature=None))
    corpus = create_corpus(tmp_path / "corpus", "tiny-llama", base.fingerprint, base.tokenizer, 512)
    append_shard(corpus, "chitchat-s0-00000000.parquet", rows, {"source": "chitchat", "first": 0, "count": len(rows),
                                                                "settings": {"seed": 0}})
    prompts, train = heldout_split(corpus.root, 3)
    held = {tuple(r.input_ids[:r.answer_spans[0][0]]) for r in rows} - {tuple(t) for t in train}
    assert len(prompts) == 3 and {tuple(p) for p in prompts} <= held and len(train) < len(rows)
    values = fit_tree_values(component, corpus.root, prompts=3, max_new_tokens=24)
    assert values.fitted["prompts"] == 3 and values.fitted["candidates"] > values.fitted["kept"] > 0
    loaded = Decoder.from_pretrained(component, dtype="float32")  # every listed file's sha256 checked
    assert loaded.draft.tree_values == values
    ids = prompts[0]
    assert loaded.generate(ids, max_new_tokens=24, method="eagle3-anpd").tokens == plain.generate(
        ids, max_new_tokens=24, method="ar").tokens
    # the gate measures a candidate at its best too: its values are fitted before it is measured, on as many held-out
    # prompts as the committed draft's were, and go with it
    candidate = _component(tmp_path / "candidate", base, scale=0.0)
    row = adopt(candidate, component, limit=1, corpus=corpus.root, dry_run=True)
    fitted = tree_values(read_component(candidate))
    assert not row["adopted"] and fitted.fitted["prompts"] == values.fitted["prompts"] == 3
    other = create_corpus(tmp_path / "other", "tiny-llama", "sha256:another", base.tokenizer, 512)
    append_shard(other, "chitchat-s0-00000000.parquet", rows, {"source": "chitchat", "first": 0, "count": len(rows),
                                                               "settings": {"seed": 0}})
    with pytest.raises(ValueError, match="written by another base model"):
        fit_tree_values(component, other.root, prompts=3)
