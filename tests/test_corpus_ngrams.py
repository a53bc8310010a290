"""The corpus's n-gram tables (ppdkit/runtime/drafters/corpus_ngrams.py) and `eagle3-corpus`, which merges their chain
into EAGLE-3's grown tree: the tables hold exactly each context's most frequent follower (against counting by hand),
they are built once per corpus version and read back after, a chain's rates learn from every step, and decoding stays
the base model's own whatever the corpus or the draft holds (poisoned drafts too), keeping more tokens a step where the
corpus knows the answer."""

import math
import random
from collections import Counter, defaultdict

import pytest
import torch
from conftest import tiny_model_on
from test_draft_heads import VOCAB
from test_eagle3 import _decoder, _draft_tensors

import ppdkit.runtime.drafters.corpus_ngrams as corpus_ngrams
from ppdkit.data_pipeline.corpus import CorpusRow, append_shard, create_corpus
from ppdkit.runtime.drafters.corpus_ngrams import CorpusChain, CorpusLookup, build_tables, load_corpus_ngrams


def _by_hand(texts: list[list[int]], max_n: int) -> dict[tuple[int, ...], tuple[int, int]]:
    """Every context of up to max_n tokens within a text -> its most frequent follower (ties: the smallest id) and
    that follower's kind: (n - 1) * 4 + its share of the context's followers in quarters (of 255)."""
    counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    for text in texts:
        for end in range(1, len(text)):
            for n in range(1, min(max_n, end) + 1):
                counts[tuple(text[end - n:end])][text[end]] += 1
    found = {}
    for context, c in counts.items():
        best = min(c, key=lambda t: (-c[t], t))
        found[context] = best, (len(context) - 1) * 4 + (c[best] * 255 // sum(c.values())) * 4 // 256
    return found


def test_the_tables_hold_each_contexts_most_frequent_follower_and_lookups_take_the_longest():
    rng = random.Random(0)
    texts = [[rng.randrange(12) for _ in range(rng.randint(1, 40))] for _ in range(60)]  # small ids: many repeats
    expected = _by_hand(texts, 4)
    table = build_tables(texts, 4)
    assert [len(t) for t in table.tables] == [sum(len(c) == n for c in expected) for n in range(1, 5)]
    for context, found in expected.items():
        assert table.query(list(context)) == found, context
    assert len({kind for _, kind in expected.values()}) > 8  # many kinds of guess were checked
    for _ in range(300):  # a text's longest known ending decides, whatever came before it
        text = [rng.randrange(14) for _ in range(rng.randint(1, 9))]  # 12, 13: never in the corpus
        known = [n for n in range(min(4, len(text)), 0, -1) if tuple(text[-n:]) in expected]
        assert table.query(text) == (expected[tuple(text[-known[0]:])] if known else None), text
    assert build_tables([[1, 2], [3, 4]], 2).query([2]) is None  # no context runs into the next text


def test_a_chain_reads_each_guess_after_the_ones_before_it_and_learns_its_rates_by_kind():
    table = build_tables([[5, 6, 7, 8, 9], [1, 6, 7, 3], [1, 6, 7, 3]], 3)
    chain = CorpusChain(table, [0, 5])
    # [5, 6] -> 7 (n 2, all of its followers: kind 7), then [5, 6, 7] -> 8 and [6, 7, 8] -> 9 (kind 11)
    assert chain.draft(6) == [7, 8, 9] and chain.kinds == [7, 11, 11]
    assert chain.values() == pytest.approx([math.log(0.5) * k for k in (1, 2, 3)])
    chain.update([7, 8, 9], accepted=[7], next_token=4)  # 7 kept, 8 wrong: the chain's later guesses are untried
    assert (chain.right[7], chain.tried[7], chain.right[11], chain.tried[11]) == (2.0, 3.0, 1.0, 3.0)
    assert chain.values() == pytest.approx([math.log(2 / 3), math.log(2 / 3) + math.log(1 / 3),
                                            math.log(2 / 3) + 2 * math.log(1 / 3)])
    assert table.query([6, 7]) == (3, 6)  # [6, 7] -> 3 twice of 3: a share of 170/255, its third quarter (n 2)
    assert chain.text == [0, 5, 6, 7]  # the next root (4) joins with the next draft
    with pytest.raises(ValueError, match="below 65536"):
        build_tables([[70000, 1]], 2)


def test_a_chain_remembers_its_answers_queries_and_drafts_what_asking_anew_drafts(monkeypatch):
    """A step whose chain was right asks the last step's queries again: answered from the chain's memory, its chains
    are the ones every query asked of the tables gives, for fewer queries."""
    rng = random.Random(3)
    texts = [[rng.randrange(10) for _ in range(rng.randint(5, 40))] for _ in range(40)]
    table = build_tables(texts, 4)
    asked = Counter()
    query = table.query
    monkeypatch.setattr(table, "query", lambda text: asked.update([mode]) or query(text))
    chain = CorpusChain(table, texts[0][:3])
    for step in range(80):
        root = rng.randrange(10)
        mode = "anew"
        expected = table.draft(chain.text + [root], chain.length)
        mode = "remembering"
        assert chain.draft(root) == expected[0] and chain.kinds == expected[1], step
        right = rng.randrange(len(expected[0]) + 1)  # the chain right up to here, then the base model's own token
        chain.update(expected[0], expected[0][:right], rng.randrange(10))
    assert asked["remembering"] < 0.8 * asked["anew"]  # the remembered answers stood in for queries


def _tiny_corpus(root, tok, texts: list[list[int]]):
    corpus = create_corpus(root, "tiny", "tiny-fingerprint", tok, 512)
    rows = [CorpusRow(id=f"r{i}", source="chitchat", input_ids=t, answer_spans=[(1, len(t))], seed=0,
                      temperature=0.0, prompt_temperature=None) for i, t in enumerate(texts)]
    append_shard(corpus, "chitchat-s0-00000000.parquet", rows, {"source": "chitchat", "first": 0, "count": len(rows),
                                                                 "settings": {"seed": 0}})
    return corpus


def test_the_tables_are_built_once_per_corpus_version(tmp_path, monkeypatch):
    from ppdkit.models.tiny import build_tiny_llama

    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path / "cache"))
    _, tok = build_tiny_llama()
    corpus = _tiny_corpus(tmp_path / "corpus", tok, [[1, 2, 3, 4], [2, 3, 5]])
    built = load_corpus_ngrams(corpus.root, max_n=3)
    assert built.query([2, 3]) == (4, 5) and len(list((tmp_path / "cache" / "corpus-ngrams").iterdir())) == 1

    def no_build(*args, **kwargs):
        raise AssertionError("built again")
    monkeypatch.setattr(corpus_ngrams, "build_tables", no_build)
    again = load_corpus_ngrams(corpus.root, max_n=3)  # read back, not built
    assert [t.tolist() for t in again.tables] == [t.tolist() for t in built.tables]
    monkeypatch.undo()
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path / "cache"))
    append_shard(corpus, "chitchat-s0-00000002.parquet",
                 [CorpusRow(id="r9", source="chitchat", input_ids=[2, 3, 5, 2, 3, 5], answer_spans=[(1, 6)], seed=0,
                            temperature=0.0, prompt_temperature=None)],
                 {"source": "chitchat", "first": 2, "count": 1, "settings": {"seed": 0}})
    assert load_corpus_ngrams(corpus.root, max_n=3).query([2, 3]) == (5, 6)  # the grown corpus: built anew


def _greedy_texts(decoder, rng, count: int) -> tuple[list[list[int]], list[list[int]]]:
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 8))] for _ in range(count)]
    return prompts, [p + decoder.generate(p, max_new_tokens=40, method="ar").tokens for p in prompts]


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_eagle3_corpus_is_the_base_models_greedy_output_whatever_the_corpus_holds(path, monkeypatch):
    """A corpus of random text (its guesses nearly always wrong) and one of the model's own greedy answers (right as
    far as they reach): the same tokens as ar either way, and the second keeps more a step than eagle3-anpd."""
    model, tok = tiny_model_on(path, monkeypatch)
    rng = random.Random(1)
    vocab = torch.arange(3, VOCAB, 3)
    decoder = _decoder(model, tok, _draft_tensors(model, vocab, 0, scale=0.5), vocab)
    prompts, answered = _greedy_texts(decoder, rng, 12)
    noise = [[rng.randrange(VOCAB) for _ in range(200)] for _ in range(20)]
    steps = {}
    for name, texts in (("noise", noise), ("answers", answered)):
        decoder.draft.corpus = CorpusLookup(None, build_tables(texts))  # as loaded, the tables already read
        steps[name] = 0
        for ids in prompts:
            plain = decoder.generate(ids, max_new_tokens=40, method="ar").tokens
            out = decoder.generate(ids, max_new_tokens=40, method="eagle3-corpus")
            assert out.tokens == plain, (name, ids)
            steps[name] += out.steps
    steps["anpd"] = sum(decoder.generate(ids, max_new_tokens=40, method="eagle3-anpd").steps for ids in prompts)
    assert steps["answers"] < steps["anpd"], steps


def test_eagle3_corpus_needs_a_corpus(monkeypatch):
    model, tok = tiny_model_on("pytorch", monkeypatch)
    vocab = torch.arange(3, VOCAB, 3)
    decoder = _decoder(model, tok, _draft_tensors(model, vocab, 0), vocab)
    assert "eagle3-corpus" not in decoder.methods() and "eagle3-anpd" in decoder.methods()
    with pytest.raises(ValueError, match="self-distilled corpus.*ppdkit corpus grow"):
        decoder.generate([5, 6, 7], max_new_tokens=4, method="eagle3-corpus")


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_poisoned_drafts_beside_the_corpus_chain_cannot_change_greedy_output(path, monkeypatch):
    """NaN, infinite and huge draft weights (as test_eagle3's poisoned drafts) next to a corpus chain that is often
    right: the merged tree's values mix both, and the output stays ar's."""
    model, tok = tiny_model_on(path, monkeypatch)
    rng = random.Random(2)
    vocab = torch.arange(3, VOCAB, 3)
    clean = _decoder(model, tok, _draft_tensors(model, vocab, 0, scale=0.5), vocab)
    prompts, answered = _greedy_texts(clean, rng, 6)
    table = build_tables(answered + [[rng.randrange(VOCAB) for _ in range(100)] for _ in range(5)])
    for case, value in enumerate((math.nan, math.inf, -math.inf, 1e30)):
        tensors = _draft_tensors(model, vocab, case, scale=rng.choice([0.1, 3.0]))
        name = sorted(tensors)[case % len(tensors)]
        tensors[name] = torch.full_like(tensors[name], value)
        decoder = _decoder(model, tok, tensors, vocab)
        decoder.draft.corpus = CorpusLookup(None, table)
        for ids in prompts:
            plain = decoder.generate(ids, max_new_tokens=40, method="ar").tokens
            assert decoder.generate(ids, max_new_tokens=40, method="eagle3-corpus").tokens == plain, (case, name, ids)


def test_ppd_corpus_is_the_base_models_greedy_output_and_its_chain_pays_where_the_corpus_knows(tmp_path, monkeypatch):
    """ppd-corpus: the prompt tokens' tree with the corpus's chain first among the lookup chains. A corpus of noise and
    one of the model's own greedy answers: ar's tokens either way; the second keeps more a step than ppd-lookup, and a
    step never feeds more rows than the decoder sized its cache for."""
    from conftest import write_tiny_ppd_component

    from ppdkit.runtime.decoder import Decoder

    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    decoder = Decoder.from_pretrained(write_tiny_ppd_component(tmp_path / "ppd"), dtype="float32", tree_size=8)
    rng = random.Random(3)
    prompts, answered = _greedy_texts(decoder, rng, 10)
    noise = [[rng.randrange(VOCAB) for _ in range(200)] for _ in range(20)]
    steps = {}
    for name, texts in (("noise", noise), ("answers", answered)):
        decoder.draft.corpus = CorpusLookup(None, build_tables(texts))
        steps[name] = 0
        for ids in prompts:
            out = decoder.generate(ids, max_new_tokens=40, method="ppd-corpus")
            assert out.tokens == decoder.generate(ids, max_new_tokens=40, method="ar").tokens, (name, ids)
            assert max(out.rows_per_step) <= decoder.step_rows("ppd-corpus")
            steps[name] += out.steps
    steps["lookup"] = sum(decoder.generate(ids, max_new_tokens=40, method="ppd-lookup").steps for ids in prompts)
    assert steps["answers"] < steps["lookup"], steps


def test_a_prefetch_builds_the_tables_in_a_thread_and_the_load_takes_them(tmp_path, monkeypatch):
    """What a first decode starts beside its model's load: the tables built in another thread, once; the load then
    takes that build's tables (built nowhere else) and a later load reads the cached file."""
    import threading

    from ppdkit.models.tiny import build_tiny_llama
    from ppdkit.runtime.drafters.corpus_ngrams import prefetch_corpus_ngrams

    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path / "cache"))
    _, tok = build_tiny_llama()
    corpus = _tiny_corpus(tmp_path / "corpus", tok, [[1, 2, 3, 4], [2, 3, 5], [2, 3, 4]])
    threads, real = [], corpus_ngrams.build_tables

    def counted(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)
    monkeypatch.setattr(corpus_ngrams, "build_tables", counted)
    prefetch_corpus_ngrams(corpus.root, max_n=3)
    prefetch_corpus_ngrams(corpus.root, max_n=3)  # asked twice: built once
    assert load_corpus_ngrams(corpus.root, max_n=3).query([2, 3]) == (4, 1 * 4 + 2)  # 2 tokens; 2 of 3: bucket 2
    assert len(threads) == 1 and threads[0].startswith("corpus-ngrams")
    assert load_corpus_ngrams(corpus.root, max_n=3).query([2, 3])[0] == 4 and len(threads) == 1  # read back


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_ppd_corpus_stays_ar_whatever_the_prompt_tokens_hold(path, monkeypatch):
    """Prompt tokens of NaN, infinite, huge and random values beside a corpus chain that is often right: ppd-corpus
    gives ar's tokens on both kernel paths."""
    from ppdkit.runtime.decoder import Decoder
    from ppdkit.runtime.drafters.draft_parts import PromptTokenParts
    from ppdkit.runtime.drafters.ppd import PromptTokenSet
    from ppdkit.runtime.trees.tree import best_tree_for_size

    model, tok = tiny_model_on(path, monkeypatch)
    rng = random.Random(4)
    width = model.get_input_embeddings().weight.shape[1]
    tree = best_tree_for_size([[0.5, 0.2, 0.1], [0.3, 0.1], [0.2]], 8)
    table = None
    for case, value in enumerate((math.nan, math.inf, -math.inf, 1e30, None)):
        embeddings = torch.randn(3, width, generator=torch.Generator().manual_seed(case)) * 3
        if value is not None:
            embeddings[case % 3, rng.randrange(width)] = value
        decoder = Decoder(model, tok, PromptTokenParts.of_tree(PromptTokenSet(embeddings, None, 3, 1, "ensemble"),
                                                               tree))
        if table is None:  # the model's own greedy answers, and some noise
            prompts, answered = _greedy_texts(decoder, rng, 6)
            table = build_tables(answered + [[rng.randrange(VOCAB) for _ in range(100)] for _ in range(5)])
        decoder.draft.corpus = CorpusLookup(None, table)
        for ids in prompts:
            plain = decoder.generate(ids, max_new_tokens=40, method="ar").tokens
            assert decoder.generate(ids, max_new_tokens=40, method="ppd-corpus").tokens == plain, (case, ids)
