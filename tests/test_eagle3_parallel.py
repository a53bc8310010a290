"""Prompt tokens for the EAGLE-3 draft (models/eagle3.py PARALLEL, train.parallel_draft, eagle3-ppd*): the rows the
trainer unrolls are what the decoder's one draft forward gives, decoding stays the base model's whatever the prompt
tokens hold (poisoned ones too, beside a corpus chain that is often right, so long paths are kept and the draft cache
refilled), a bad pair is refused at load, and a component without them is refused before the model loads."""

import math
import random

import pytest
import torch
from conftest import tiny_model_on
from test_corpus_ngrams import _greedy_texts
from test_draft_heads import VOCAB
from test_eagle3 import _decoder, _draft_tensors, unrolled_in_float64

from ppdkit.models.eagle3 import PARALLEL, readout
from ppdkit.runtime.drafters.corpus_ngrams import CorpusLookup, build_tables
from ppdkit.runtime.drafters.eagle3_drafter import Eagle3ParallelDrafter
from ppdkit.runtime.trees.grown_tree import level_logp
from ppdkit.trainer.config import TrainConfig


def _prompt_tokens(model, count: int, seed: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    width = model.config.hidden_size
    return torch.randn(count, width, generator=g) * scale, torch.randn(count, width, generator=g) * scale


def test_the_rows_trained_are_the_decoders_one_draft_forward(tiny_f64):
    """With train.parallel_draft, the trainer's step k at position t gives the log-probabilities the decoder's one
    draft forward gives in its row k (the root's row, then each prompt token's): the same inputs, visibility and
    rotary positions."""
    model, tok = tiny_f64
    unrolled, tensors, vocab, ids = unrolled_in_float64(2, parallel_draft=True)
    assert tensors["parallel.embeds"].shape == tensors["parallel.hidden"].shape == (2, model.config.hidden_size)
    decoder = _decoder(model, tok, {k: v for k, v in tensors.items() if k not in PARALLEL}, vocab)
    decoder.draft.eagle3.parallel = tuple(tensors[name] for name in PARALLEL)
    t = 5
    drafter = Eagle3ParallelDrafter(decoder, decoder.model.new_cache(64), nodes=2, beam=1, depth=3)
    drafter.prefill(ids[:t + 1])
    h = drafter._read_verified(int(ids[t + 1]), decoder.draft.eagle3.parallel)  # [1 + P, H]
    assert drafter.draft_cache.length == t + 1  # the prompt tokens' rows are not kept
    logp = level_logp(readout(h, decoder.draft.eagle3.weights, decoder.draft.eagle3.eps))
    for k in range(3):
        assert torch.allclose(logp[k], unrolled[k][0][t].float(), atol=1e-6), k


@pytest.mark.parametrize("path", ["native", "native-q4", "pytorch"])
def test_the_prompt_tokens_cannot_change_greedy_output(path, monkeypatch):
    """Random and poisoned (NaN, infinite, huge) prompt tokens on a random draft, beside the model's own answers as a
    corpus (so that long paths are kept and the draft cache is refilled from them): eagle3-ppd and eagle3-ppd-corpus
    give ar's tokens, and the corpus's chain keeps more than one token a step."""
    from conftest import q4_weights_or_skip

    model, tok = tiny_model_on(path.removesuffix("-q4"), monkeypatch)
    weights = q4_weights_or_skip(model) if path == "native-q4" else {}
    rng = random.Random(7)
    vocab = torch.arange(2, VOCAB, 2)
    table, emitted, steps = None, 0, 0
    for case, value in enumerate((None, math.nan, math.inf, -math.inf, 1e30)):
        decoder = _decoder(model, tok, _draft_tensors(model, vocab, case, rng.choice([0.1, 3.0])), vocab, **weights)
        embeds, hidden = _prompt_tokens(model, rng.choice([1, 3]), case, rng.choice([0.02, 5.0]))
        if value is not None:
            (embeds if case % 2 else hidden)[-1, rng.randrange(len(embeds[0]))] = value
        decoder.draft.eagle3.parallel = (embeds, hidden)
        assert "eagle3-ppd" in decoder.methods()  # the draft carries prompt tokens now
        if table is None:
            prompts, answered = _greedy_texts(decoder, rng, 5)
            table = build_tables(answered)
        decoder.draft.corpus = CorpusLookup(None, table)
        for ids in prompts:
            plain = decoder.generate(ids, max_new_tokens=32, method="ar").tokens
            for method in ("eagle3-ppd", "eagle3-ppd-corpus"):
                out = decoder.generate(ids, max_new_tokens=32, method=method)
                assert out.tokens == plain, (case, method, ids)
                emitted, steps = (emitted + len(out.tokens), steps + out.steps) if method.endswith("corpus") else (
                    emitted, steps)
    assert emitted > 1.5 * steps  # the chains were kept: multi-token steps refilled the draft cache


def test_a_draft_without_prompt_tokens_or_with_bad_ones_is_refused(tmp_path):
    """eagle3-ppd needs the draft's prompt tokens: refused from component.json before any model loads where the draft
    has none; a pair of unequal shapes is refused at load, naming both."""
    from test_eagle3_export import _component

    from ppdkit.cli.decode_commands import refuse_unserved_method
    from ppdkit.models.artifact import ArtifactError, read_component, write_component
    from ppdkit.runtime.decoder import Decoder

    plain = _component(tmp_path / "plain", "tiny-llama")
    with pytest.raises(ValueError, match="needs an EAGLE-3 draft with prompt tokens"):
        refuse_unserved_method(str(plain), "eagle3-ppd")
    refuse_unserved_method(str(plain), "eagle3-corpus")
    component = read_component(plain)
    width = component.tensors["fc.weight"].shape[0]
    tensors = {**component.tensors, "parallel.embeds": torch.zeros(2, width), "parallel.hidden": torch.zeros(3, width)}
    broken = write_component(tmp_path / "broken", "eagle3", component.hyperparameters, "tiny-llama",
                             component.base_model["fingerprint"], {}, tensors)
    refuse_unserved_method(str(broken), "eagle3-ppd")  # it says it carries them: the load checks them
    with pytest.raises(ArtifactError, match=rf"parallel.embeds and parallel.hidden, both \[P, {width}\]"):
        Decoder.from_pretrained(broken, dtype="float32", tree_size=8)


def test_prompt_tokens_train_for_a_trained_draft_and_leave_it_as_it_was(teacher_dir, tmp_path):
    """train.parallel_draft with train.freeze_draft from a sequential draft (train.init_from): its prompt tokens are
    drawn fresh and trained, every tensor of the draft stays the component's, and the new component decodes eagle3-ppd
    as ar. A freeze without prompt tokens, or prompt tokens for one depth, is refused by name."""
    from test_eagle3 import EAGLE3_TRAIN
    from test_training import BASE

    from ppdkit.models.artifact import read_component
    from ppdkit.registry.tracking import TrackerRef
    from ppdkit.runtime.decoder import Decoder
    from ppdkit.trainer.launch import run_training

    run_training(BASE, EAGLE3_TRAIN, teacher_dir, tmp_path / "draft", TrackerRef())
    draft = read_component(tmp_path / "draft" / "component")
    assert not set(PARALLEL) & set(draft.tensors)
    parallel = EAGLE3_TRAIN.model_copy(update={"parallel_draft": True, "freeze_draft": True,
                                               "init_from": str(tmp_path / "draft" / "component")})
    result = run_training(BASE, parallel, teacher_dir, tmp_path / "parallel", TrackerRef())
    assert all(math.isfinite(loss) for _, loss in result["history"])
    trained = read_component(tmp_path / "parallel" / "component")
    width = draft.tensors["fc.weight"].shape[0]
    assert trained.tensors["parallel.embeds"].shape == (EAGLE3_TRAIN.head_depth - 1, width)
    for name, tensor in draft.tensors.items():
        assert torch.equal(trained.tensors[name], tensor), name
    assert trained.hyperparameters["parallel_draft"] and trained.hyperparameters["freeze_draft"]
    decoder = Decoder.from_pretrained(tmp_path / "parallel" / "component", dtype="float32", tree_size=None)
    ids = [5, 17, 99, 5, 17, 99, 5, 17]
    assert decoder.generate(ids, max_new_tokens=16, method="eagle3-ppd").tokens == decoder.generate(
        ids, max_new_tokens=16, method="ar").tokens
    with pytest.raises(ValueError, match="train.freeze_draft trains only the draft's prompt tokens"):
        TrainConfig(method="eagle3", freeze_draft=True, init_from="somewhere")
    with pytest.raises(ValueError, match="set train.head_depth to 2 or more"):
        TrainConfig(method="eagle3", parallel_draft=True, head_depth=1)
