"""Continuous batching with drafts (ppdkit/runtime/batching/batch_engine.py, batched_verify.py): every answer, whatever
shares its steps and whenever it joins or leaves, is token for token what `Decoder.generate` gives it alone (greedy, and
sampled with its seed), for every method that shares steps; the others decode alone between steps."""

import os
import random
import threading

import pytest
import torch
from conftest import plain_tiny_decoder, tiny_model_on, write_tiny_ppd_component
from test_eagle3 import _decoder as eagle3_decoder
from test_eagle3 import _draft_tensors

from ppdkit.runtime.batching.batch_engine import BatchEngine, OneAtATime, decoding_engine
from ppdkit.runtime.drafters.corpus_ngrams import CorpusLookup, build_tables
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.batching.drafting_choice import PROBE, DraftingChoice
from ppdkit.runtime.generate_options import GenerateOptions
from ppdkit.runtime.kernels.openmp import release_openmp_threads


def _prompts(n: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """Prompts of few distinct tokens (contexts repeat, so chains and trees are often right) and their budgets."""
    rng = random.Random(seed)
    return [([rng.randrange(3, 30) for _ in range(rng.randint(1, 40))], rng.choice([1, 4, 16, 40])) for _ in range(n)]


def _alone_and_batched(decoder: Decoder, engine: BatchEngine, methods: list[str], cases: int = 12, **options):
    """Submit every prompt at once (methods in turn) and compare each answer with its own generate."""
    jobs = []
    for i, (ids, budget) in enumerate(_prompts(cases)):
        asked = GenerateOptions(method=methods[i % len(methods)], max_new_tokens=budget, **options)
        jobs.append((ids, asked, engine.submit(ids, asked)))
    for case, (ids, asked, future) in enumerate(jobs):
        batched, alone = future.result(timeout=120), decoder.generate(ids, asked)
        assert batched.tokens == alone.tokens, (asked.method, case)
        assert batched.method == alone.method and len(batched.tokens) <= asked.max_new_tokens
    return jobs


@pytest.fixture
def plain(monkeypatch):
    return plain_tiny_decoder("native", monkeypatch)


@pytest.mark.parametrize("methods", [["ar"], ["anpd"], ["self-draft"], ["ar", "anpd", "self-draft"]])
def test_batched_greedy_answers_are_each_generates(plain, methods):
    engine = BatchEngine(plain, max_batch=5)  # 12 answers through 5 places: they join and leave at every step
    try:
        _alone_and_batched(plain, engine, methods)
        assert engine.steps > 0 and not engine.active
    finally:
        engine.close()


def test_sampled_answers_follow_their_seeds(plain):
    engine = BatchEngine(plain, max_batch=4)
    try:
        _alone_and_batched(plain, engine, ["ar", "anpd"], temperature=0.8, seed=3)
    finally:
        engine.close()


@pytest.mark.parametrize("max_rows", [96, 9, 2])
def test_eagle3_trees_share_steps_losslessly_whatever_rows_they_are_given(monkeypatch, max_rows):
    """EAGLE-3's grown trees in one forward with plain and chained answers (the live text's and a corpus's), the
    draft's prompt tokens' trees (eagle3-ppd*) among them; with few rows to share, trees shrink to the root alone
    (nothing drafted) and its draft catches up on the rows it skipped."""
    model, tok = tiny_model_on("native", monkeypatch)
    vocab = torch.arange(3, 256, 3)
    decoder = eagle3_decoder(model, tok, _draft_tensors(model, vocab, 4, 0.5), vocab)
    g = torch.Generator().manual_seed(4)
    decoder.draft.eagle3.parallel = tuple(torch.randn(2, model.config.hidden_size, generator=g) for _ in range(2))
    decoder.draft.corpus = CorpusLookup(None, build_tables([ids * 3 for ids, _ in _prompts(12, seed=1)]))
    engine = BatchEngine(decoder, max_batch=6, max_rows=max_rows)
    try:
        _alone_and_batched(decoder, engine, ["eagle3-corpus", "eagle3-anpd", "eagle3", "eagle3-ppd-corpus",
                                             "eagle3-ppd", "ar", "anpd"])
    finally:
        engine.close()


def test_an_answer_alone_is_verified_as_generate_does_until_others_join(monkeypatch):
    """One answer alone in the engine stays in the scratch cache, verified as `generate` verifies; when others join,
    it moves into its range of the shared cache mid-answer and shares their steps: every answer is still its own
    generate's (an EAGLE-3 tree, whose draft reads the states each verification captures)."""
    import ppdkit.runtime.batching.batch_engine as engine_module

    model, tok = tiny_model_on("native", monkeypatch)
    vocab = torch.arange(3, 256, 3)
    decoder = eagle3_decoder(model, tok, _draft_tensors(model, vocab, 4, 0.5), vocab)
    alone, real = [], engine_module.verify
    monkeypatch.setattr(engine_module, "verify", lambda *args: alone.append(1) or real(*args))
    engine = BatchEngine(decoder, max_batch=4)
    first, joined = threading.Event(), []
    emitted = []

    def stream(tokens: list[int]) -> None:
        emitted.extend(tokens)
        if len(emitted) >= 10:
            first.set()

    try:
        ids = _prompts(1, seed=2)[0][0]
        options = GenerateOptions(method="eagle3", max_new_tokens=80)
        lone = engine.submit(ids, options, stream)
        assert first.wait(timeout=120)
        for others, budget in _prompts(3, seed=3):
            asked = GenerateOptions(method="eagle3", max_new_tokens=max(budget, 8))
            joined.append((others, asked, engine.submit(others, asked)))
        assert lone.result(timeout=120).tokens == decoder.generate(ids, options).tokens
        for others, asked, future in joined:
            assert future.result(timeout=120).tokens == decoder.generate(others, asked).tokens
        steps_alone = len(alone)
        assert 0 < steps_alone < engine.steps, (steps_alone, engine.steps)  # alone first, then shared steps
    finally:
        engine.close()


def test_no_slot_of_the_shared_cache_is_read_before_it_is_written(monkeypatch):
    """The engine's shared cache is not filled (its pages stay untouched until answers write them): filled with NaN
    instead, every answer is still its own generate's, so no row reads a slot before it is written."""
    model, tok = tiny_model_on("native", monkeypatch)
    vocab = torch.arange(3, 256, 3)
    decoder = eagle3_decoder(model, tok, _draft_tensors(model, vocab, 4, 0.5), vocab)
    unfilled, new_cache = [], decoder.model.new_cache

    def garbage(capacity, zeroed=True):
        cache = new_cache(capacity, zeroed)
        if not zeroed:
            cache.k.fill_(float("nan"))
            cache.v.fill_(float("nan"))
            unfilled.append(cache)
        return cache

    monkeypatch.setattr(decoder.model, "new_cache", garbage)
    engine = BatchEngine(decoder, max_batch=5)
    try:
        _alone_and_batched(decoder, engine, ["eagle3-anpd", "ar", "anpd", "eagle3"])
    finally:
        engine.close()
    assert len(unfilled) == 1 and unfilled[0] is engine.cache


def test_prompt_token_trees_share_steps(tmp_path):
    """PPD's trees with their prompt-token rows (and lookup chains) in the shared forward."""
    decoder = Decoder.from_pretrained(write_tiny_ppd_component(tmp_path / "component"), tree_size=8)
    engine = BatchEngine(decoder, max_batch=4)
    try:
        _alone_and_batched(decoder, engine, ["ppd", "ppd-lookup", "ar"])
    finally:
        engine.close()


def test_a_method_that_cannot_share_decodes_alone_between_steps(monkeypatch):
    model, tok = tiny_model_on("native", monkeypatch)
    decoder = Decoder.from_base("tiny-llama", skip_map=[1, 0])
    engine = BatchEngine(decoder, max_batch=4)
    try:
        _alone_and_batched(decoder, engine, ["skip", "ar"], cases=6)
    finally:
        engine.close()


def test_streams_stops_and_errors_stay_with_their_answer(plain):
    engine = BatchEngine(plain, max_batch=4)
    try:
        streamed, stop_after = [], threading.Event()

        def stream(tokens):
            streamed.extend(tokens)

        def failing(tokens):
            raise RuntimeError("the client's callback broke")

        whole = engine.submit([5, 6, 7], GenerateOptions(method="anpd", max_new_tokens=30), stream=stream)
        stopped = engine.submit([5, 6, 7], GenerateOptions(method="ar", max_new_tokens=30),
                                should_stop=lambda: stop_after.is_set() or stop_after.set())
        broken = engine.submit([8, 9], GenerateOptions(method="ar", max_new_tokens=30), stream=failing)
        assert whole.result(60).tokens == streamed == plain.generate([5, 6, 7], max_new_tokens=30, method="anpd").tokens
        assert len(stopped.result(60).tokens) == 2  # the prompt's token, then one step: should_stop said so
        with pytest.raises(RuntimeError, match="callback broke"):
            broken.result(60)
        with pytest.raises(ValueError, match="vocabulary"):
            engine.submit([10 ** 6], GenerateOptions(method="ar"))
        assert engine.generate([5, 6, 7], max_new_tokens=30, method="anpd").tokens == streamed
    finally:
        engine.close()


def test_a_thread_done_with_torch_hands_its_openmp_workers_back():
    """The cause of a worker thread's slow decodes (runtime/kernels/openmp.py): every thread that ran a parallel loop
    keeps OpenMP workers. After release_openmp_threads they are gone. The workers are told apart by their thread ids (a
    count of the process's threads also counts other tests' threads coming and going); an unrelated thread that
    starts inside the window looks like a worker that stayed, so a few tries are allowed."""
    threads = torch.get_num_threads()
    if threads < 2:
        pytest.skip("torch runs one thread here: OpenMP makes no workers")
    tids = lambda: set(os.listdir("/proc/self/task"))  # noqa: E731
    x, tries = torch.randn(1 << 20), []

    def in_thread():
        torch.set_num_threads(threads)  # this thread's own OpenMP count (a new thread's need not be torch's)
        before = tids()
        x.exp().sum()  # an elementwise operation this large runs as a parallel loop
        workers = tids() - before
        release_openmp_threads()
        tries.append((workers, workers & tids()))  # (the new threads, those of them still alive)

    release_openmp_threads()
    for _ in range(3):
        thread = threading.Thread(target=in_thread)
        thread.start()
        thread.join()
        workers, kept = tries[-1]
        if workers and not kept:
            break
    assert workers and not kept, tries  # the parallel loop made workers, and they went


def test_where_batching_cannot_run_answers_come_one_at_a_time(monkeypatch):
    """Without the native kernels (the PyTorch layers: another device) the server's engine decodes answers one after
    another in one thread, each still its generate answer."""
    decoder = plain_tiny_decoder("pytorch", monkeypatch)
    engine = decoding_engine(decoder, 8)
    try:
        assert isinstance(engine, OneAtATime)
        asked = [(ids, GenerateOptions(method="anpd", max_new_tokens=budget)) for ids, budget in _prompts(4)]
        futures = [engine.submit(ids, options) for ids, options in asked]
        for (ids, options), future in zip(asked, futures):
            assert future.result(60).tokens == decoder.generate(ids, options).tokens
    finally:
        engine.close()


def test_the_drafting_choice_follows_what_each_choice_measured():
    choice = DraftingChoice()
    assert choice.choose(1)  # alone: draft, as generate does
    tried = {choice.choose(4), choice.choose(4)}
    assert tried == {True}  # untried: drafting first, until measured
    choice.observe(4, True, tokens=6, seconds=0.010)
    assert choice.choose(4) is False  # the other is untried
    choice.observe(4, False, tokens=4, seconds=0.005)  # 800 tok/s against 600
    picks = [choice.choose(4) for _ in range(2 * PROBE)]
    assert picks.count(False) == 2 * PROBE - 2 and picks.count(True) == 2  # the loser probed once in PROBE steps
    for _ in range(20):
        choice.observe(4, True, tokens=12, seconds=0.010)  # the text turned easy: drafting pays now
    assert choice.choose(4) is True and choice.choose(8) is True  # another load: measured afresh (untried first)


def test_a_lone_answers_choice_weighs_its_own_steps_and_probes_plain_steps_rarely():
    choice = DraftingChoice(weighs_one=True, plain_probe=4 * PROBE)
    assert choice.choose(1) is True and choice.choose(1) is True  # untried: drafting first
    choice.observe(1, True, tokens=2, seconds=0.020)
    assert choice.choose(1) is False  # then a plain step
    choice.observe(1, False, tokens=1, seconds=0.008)  # 100 tok/s against 125: drafting does not pay
    picks = [choice.choose(1) for _ in range(4 * PROBE)]
    assert picks.count(True) == 4  # drafting tried once in PROBE steps, to notice when the text turns easy
    choice.observe(1, True, tokens=4, seconds=0.020)
    choice.observe(1, True, tokens=4, seconds=0.020)  # now it pays
    picks = [choice.choose(1) for _ in range(8 * PROBE)]
    assert picks.count(False) == 2  # a plain step once in 4 * PROBE, to notice when it stops paying
