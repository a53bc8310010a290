"""EAGLE-3 (ppdkit/models/eagle3.py, ppdkit/trainer/eagle3_run.py, ppdkit/runtime/drafters/eagle3_drafter.py): the
training-time test's attention is the decoder's (a draft unrolled in training gives the logits the decoder's draft cache
and tree rows give), training on Ray Train workers, the component loads and decodes, and the lossless property whatever
the draft holds (random and poisoned drafts on both kernel paths, float64 against transformers' greedy, repetitive text
so that long paths are accepted and the draft cache is rolled back and refilled)."""

import math
import random

import pytest
import torch
from conftest import hf_greedy, q4_weights_or_skip, tiny_model_on
from test_draft_heads import VOCAB
from test_sampling import first_two_tokens_follow_the_model
from test_training import BASE, train_as

from ppdkit.data_pipeline.teacher_cache import ShardSequence
from ppdkit.models.artifact import ArtifactError, read_component
from ppdkit.models.eagle3 import Eagle3Draft, aux_layers, expected_shapes
from ppdkit.models.loading import load_base_model
from ppdkit.registry.tracking import TrackerRef
import ppdkit.runtime.forward.linear as linear_module
from ppdkit.runtime.forward.linear import QUANTIZED
from ppdkit.runtime.acceptance import Sampling
from ppdkit.runtime.batching.drafting_choice import DraftingChoice
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.draft_parts import Eagle3Parts
from ppdkit.runtime.decoder_loading import draft_matrices
from ppdkit.runtime.drafters.drafter import Proposal, verify
from ppdkit.models.eagle3 import readout
from ppdkit.runtime.drafters.eagle3_drafter import Eagle3Drafter, draft_rows, readout_top
from ppdkit.runtime.forward.layer_states import forward_with_states, states_after
from ppdkit.runtime.trees.grown_tree import StepCost, by_value, level_logp, level_top
from ppdkit.runtime.drafters.head_loading import eagle3_set
from ppdkit.runtime.trees.tree_layout import shape_layout
from ppdkit.trainer.autocast_probe import use_autocast
from ppdkit.trainer.config import TrainConfig
from ppdkit.trainer.launch import run_training
from ppdkit.trainer.training_methods import TRAINING_METHODS

EAGLE3 = ("eagle3", "eagle3-anpd")
EAGLE3_TRAIN = train_as("eagle3", head_depth=3, draft_vocab=128, lr=0.001, precision="auto")


def _draft_tensors(model, vocab: torch.Tensor, seed: int, scale: float = 1.0) -> dict[str, torch.Tensor]:
    draft = Eagle3Draft(expected_shapes(model.config, len(vocab)), model.get_output_embeddings().weight.detach()[vocab],
                        seed)
    g = torch.Generator().manual_seed(seed)
    return {name: (t.detach() * (1 + scale * torch.randn(t.shape, generator=g))) for name, t in draft().items()}


def _decoder(model, tok, tensors: dict[str, torch.Tensor], vocab: torch.Tensor, dtype=None, **weights) -> Decoder:
    decoder = Decoder(model, tok, None, **weights)
    layers = aux_layers(model.config.num_hidden_layers)
    decoder.draft = Eagle3Parts(eagle3=eagle3_set({k: v if dtype is None else v.to(dtype) for k, v in tensors.items()},
                                                  vocab, layers, model, draft_matrices(decoder.model.weight_format)))
    return decoder  # as the loader makes it


def test_forward_with_states_gives_the_forwards_hidden_states_and_transformers_layers(tiny_f64):
    model, tok = tiny_f64
    decoder = Decoder(model, tok)
    ids = torch.tensor([5, 9, 200, 31, 7])
    lean = decoder.model
    cache = lean.new_cache(16)
    final, states = forward_with_states(lean, lean.embed_ids(ids), torch.arange(5), cache, None, (1, 0, 1))
    whole = lean.forward(lean.embed_ids(ids), torch.arange(5), lean.new_cache(16), None)
    assert torch.equal(final, whole)  # the segments are the same arithmetic
    with torch.no_grad():
        hf = model(ids[None], output_hidden_states=True).hidden_states
    assert torch.allclose(states, torch.cat([hf[1][0], hf[0][0], hf[1][0]], dim=-1), atol=1e-10)
    cache = lean.new_cache(16)  # training's features: the same states, the layers above the last asked for not run
    top, only = states_after(lean, lean.embed_ids(ids), torch.arange(5), cache, None, (1, 0, 1))
    assert torch.equal(only, states) and torch.equal(top, states[:, :lean.hidden]) and not cache.k[1:].any()
    assert aux_layers(2) == (1, 1, 1) and aux_layers(30) == (2, 15, 27)  # never transformers' normed last entry


def test_the_native_layers_read_the_states_in_the_same_call(monkeypatch):
    """On the native layers a step's states come from its one call (decoder_layers_states), bit for bit the forward
    run in segments that stop at each captured layer: hidden states, states, and the keys/values written."""
    from ppdkit.runtime.forward.layer_states import run_with_states

    model, tok = tiny_model_on("native", monkeypatch)
    lean = Decoder(model, tok).model
    g = torch.Generator().manual_seed(0)
    for rows in (1, 5):
        context = 7
        mask = torch.ones(rows, context + rows, dtype=torch.bool).tril(diagonal=context)
        if rows > 2:
            mask[-1, context + 1] = False  # a tree row that does not see a sibling
        x = lean.embed_ids(torch.randint(0, lean.vocab_size, (rows,), generator=g))
        positions = torch.arange(context, context + rows)
        caches = [lean.new_cache(32), lean.new_cache(32)]
        for cache in caches:
            cache.k.normal_(generator=torch.Generator().manual_seed(1))
            cache.v.normal_(generator=torch.Generator().manual_seed(2))
            cache.length = context
        assert getattr(lean.layer_runner(rows, positions, caches[0], mask), "with_states", None) is not None
        one = forward_with_states(lean, x, positions, caches[0], mask, (2, 0, 1))
        segments = run_with_states(lean.layer_runner(rows, positions, caches[1], mask), lean, x, (2, 0, 1))
        assert torch.equal(one[0], segments[0]) and torch.equal(one[1], segments[1]), rows
        assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)


def test_a_shared_step_reads_the_states_in_the_same_call(monkeypatch):
    """Continuous batching's step (several answers' rows in one shared cache, each row in its window) reads its
    states in its one call too (forward_windows_states), bit for bit the windows' forward run in segments."""
    from ppdkit.runtime.forward.layer_states import run_with_states

    model, tok = tiny_model_on("native", monkeypatch)
    lean = Decoder(model, tok).model
    g = torch.Generator().manual_seed(0)
    # answer A: 7 committed slots from 0, its root alone; answer B: 5 committed from 32, a tree of 3 rows
    window = torch.tensor([[0, 7, 7], [32, 39, 37], [32, 39, 38], [32, 39, 39]])
    positions = torch.tensor([7, 5, 6, 6])
    bias = torch.full((4, 8), float("-inf"), dtype=lean.dtype)
    bias[0, :8] = 0
    bias[1:, :5] = 0
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # the two children do not see each other
    bias[1:, 5:8].masked_fill_(tree, 0)
    bias = bias.repeat(lean.group, 1)
    x = lean.embed_ids(torch.randint(0, lean.vocab_size, (4,), generator=g))
    caches = [lean.new_cache(64), lean.new_cache(64)]
    for cache in caches:
        cache.k.normal_(generator=torch.Generator().manual_seed(1))
        cache.v.normal_(generator=torch.Generator().manual_seed(2))
    one = lean.forward_windows_states(x, positions, caches[0], window, bias, (2, 0, 1))
    segments = run_with_states(lambda h, start, stop: lean.forward_windows(h, positions, caches[1], window, bias,
                                                                           start, stop), lean, x, (2, 0, 1))
    assert torch.equal(one[0], segments[0]) and torch.equal(one[1], segments[1])
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
    other = lean.forward_windows_states(x, positions, caches[0], window, None, (2, 0, 1))  # the tree's mask matters
    assert not torch.equal(other[0][1:], one[0][1:]) and torch.equal(other[0][0], one[0][0])


def unrolled_in_float64(seed: int, **keys) -> tuple[list, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """A draft of random weights (train.method eagle3, head_depth 3, `keys`) unrolled by the trainer in float64 on a
    random sequence of 12 tokens -> (per step k: rows at positions t whose entry t + 1 + k exists, the draft's
    tensors, its draft vocabulary, the sequence)."""
    base = load_base_model("tiny-llama", quantization="none", dtype="float32")
    base.model.double()
    ids = torch.tensor([random.Random(seed).randrange(VOCAB) for _ in range(12)])
    seq = ShardSequence(0, ids, torch.arange(11), torch.zeros(11, 4, dtype=torch.long), torch.zeros(11, 4),
                        torch.zeros(11))
    run = TRAINING_METHODS["eagle3"].start(TrainConfig(method="eagle3", head_depth=3, draft_vocab=VOCAB, **keys),
                                           base, [seq])
    run.module.double()
    run.embed = run.embed.double()
    cos, sin = base.model.model.rotary_emb(torch.zeros(1, dtype=torch.float64), torch.arange(64)[None])
    run.cos, run.sin = cos[0], sin[0]
    tensors = {k: v.detach().clone() * (1 + 0.5 * torch.randn(v.shape, dtype=v.dtype)) for k, v in run.module().items()}
    batch = run.batch([seq], "train")
    with torch.no_grad():  # in float64: the trainer's kept states are bfloat16
        states = base.model(ids[None], output_hidden_states=True).hidden_states
    batch.fused_input = torch.cat([states[k] for k in run.layers], dim=-1)
    with torch.no_grad():
        return run.unroll(tensors, batch), tensors, run.module.draft_vocab, ids


def test_the_training_time_test_is_what_the_decoder_drafts(tiny_f64):
    """A draft unrolled by the trainer on a sequence gives, at step k and position t, the log-probabilities the
    decoder's draft gives for the node k + 1 deep on the sequence's own path after t: the training-time test's
    visibility and rotary positions are the decoder's draft cache and tree rows."""
    model, tok = tiny_f64
    unrolled, tensors, vocab, ids = unrolled_in_float64(1)
    decoder = _decoder(model, tok, tensors, vocab)
    lean, t = decoder.model, 5
    drafter = Eagle3Drafter(decoder, lean.new_cache(64), nodes=2, beam=1, depth=1)
    drafter.prefill(ids[:t + 1])  # verified: positions 0 .. t
    h = drafter._read_verified(int(ids[t + 1]))  # [1, H]: the root is token t + 1
    cache, committed = drafter.draft_cache, drafter.draft_cache.length
    for k in range(3):
        logp = level_logp(readout(h, decoder.draft.eagle3.weights, decoder.draft.eagle3.eps))
        assert torch.allclose(logp[0], unrolled[k][0][t].float(), atol=1e-6), k
        if k == 2:
            break
        # the tree's row for the path's node k + 1 deep
        visible = torch.zeros(1, cache.length + 1, dtype=torch.bool)
        visible[0, :committed] = True
        visible[0, committed:] = True  # its ancestors on the path (one row per earlier depth) and itself
        h = draft_rows(lean, decoder.draft.eagle3, cache, h, ids[t + 2 + k:t + 3 + k], torch.tensor([t + 1 + k]), visible)
        cache.commit(None, 1)


@pytest.mark.parametrize("matrices,bits", [(None, None), (QUANTIZED, 8), (QUANTIZED, 4)],
                         ids=["model-dtype", "Q8_0", "Q4_1"])
def test_the_native_draft_layer_is_the_pytorch_one(matrices, bits, monkeypatch):
    """The draft layer in one native call (where the CPU kernels run its matrices) gives the PyTorch operations'
    h and writes the same keys and values, for tree rows that see parts of the cache, and its native readout the
    same guesses with the same log-probabilities; its matrices as the model's, or in Q8_0 or Q4_1 blocks (what bfloat16
    and GGUF decoders draft with where the CPU has VNNI: Q4_1, head_loading.EAGLE3_BLOCK_BITS)."""
    import dataclasses

    model, tok = tiny_model_on("native", monkeypatch)
    if matrices == QUANTIZED and not linear_module.native_kernels().quantized_available():
        pytest.skip("this CPU has no AVX512-VNNI: no GGUF block kernel")
    vocab = torch.arange(3, VOCAB, 3)
    decoder = _decoder(model, tok, _draft_tensors(model, vocab, 4, 0.5), vocab)
    decoder.draft.eagle3 = eagle3_set(_draft_tensors(model, vocab, 4, 0.5), vocab, decoder.draft.eagle3.layers, model,
                                      matrices, **({"bits": bits} if bits else {}))
    native = decoder.draft.eagle3
    assert (native.weights["qkv"].weight is None) == (matrices == QUANTIZED)
    if bits:  # the blocks asked for: Q4_1's panels are two thirds the size of Q8_0's
        panels = native.weights["qkv"].panels
        other = eagle3_set(_draft_tensors(model, vocab, 4, 0.5), vocab, native.layers, model, matrices,
                           bits=12 - bits).weights["qkv"].panels
        assert (panels.numel() < other.numel()) == (bits == 4)
    assert native.native_weights  # the path under test really runs
    pytorch = dataclasses.replace(native, native_weights=[], native_shape=[])
    g = torch.Generator().manual_seed(0)
    caches = [native.new_cache(64, torch.float32, "cpu") for _ in range(2)]
    for cache in caches:  # the same committed rows in both
        cache.k[..., :20] = torch.randn(cache.k[..., :20].shape, generator=g.manual_seed(1))
        cache.v[:, :, :20] = torch.randn(cache.v[:, :, :20].shape, generator=g.manual_seed(2))
        cache.length = 20
    for rows in (1, 4, 11):
        hidden = torch.randn(rows, model.config.hidden_size, generator=g)
        tokens = torch.randint(0, VOCAB, (rows,), generator=g)
        visible = torch.rand(rows, 20 + rows, generator=g) < 0.6
        visible[:, 20:] |= torch.eye(rows, dtype=torch.bool)  # each row sees itself
        h = [draft_rows(decoder.model, draft, cache, hidden, tokens, torch.full((rows,), 20 + rows), visible)
             for draft, cache in zip((native, pytorch), caches)]
        assert torch.allclose(h[0], h[1], atol=1e-5, rtol=1e-5), rows
        for a, b in ((caches[0].k, caches[1].k), (caches[0].v, caches[1].v)):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), rows
        top = [readout_top(decoder.model, draft, h[0], 3) for draft in (native, pytorch)]
        assert torch.equal(top[0][1], top[1][1]), rows  # the same guesses of every row, best first
        assert torch.allclose(top[0][0], top[1][0], atol=1e-5, rtol=1e-5), rows


def test_the_native_readout_keeps_a_bad_draft_worthless(monkeypatch):
    """A row of NaN states (a draft gone bad) gets log-probabilities of -inf from the native readout, as from
    level_top: worthless guesses, never a child outranking its parent; the other rows are untouched."""
    model, tok = tiny_model_on("native", monkeypatch)
    vocab = torch.arange(3, VOCAB, 3)
    decoder = _decoder(model, tok, _draft_tensors(model, vocab, 4, 0.5), vocab)
    draft = decoder.draft.eagle3
    assert draft.native_weights and decoder.model.native is not None  # the native readout really runs
    h = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(5))
    h[1] = float("nan")
    values, indices = readout_top(decoder.model, draft, h, 2)
    assert values.shape == indices.shape == (3, 2)
    assert torch.isneginf(values[1]).all() and torch.isfinite(values[[0, 2]]).all()
    expected = level_top(readout(h[[0, 2]], draft.weights, draft.eps), 2)
    assert torch.equal(indices[[0, 2]], expected[1])


def test_the_draft_cache_keeps_every_verified_position_and_drops_the_tree(tiny_f64):
    """Steps of a real decode: after each proposal the draft cache holds one row per verified position (the text
    so far), whatever the tree held, and its rows are those a drafter that read the whole text at once holds."""
    model, tok = tiny_f64
    vocab = torch.arange(VOCAB)
    decoder = _decoder(model, tok, _draft_tensors(model, vocab, 1, 0.3), vocab, torch.float64)
    ids = torch.tensor([random.Random(2).randrange(VOCAB) for _ in range(9)])
    cache = decoder.model.new_cache(64)
    drafter = Eagle3Drafter(decoder, cache, nodes=8, beam=2, depth=4)
    drafter.choice = DraftingChoice()  # every step drafts (a lone answer's steps not weighed: these take no time)
    drafter.prefill(ids[:4])
    drafter.propose(int(ids[4]))
    assert drafter.draft_cache.length == 4  # positions 0 .. 3; the tree's rows rolled back
    for t in range(4, 8):  # verify a one-node path at a time: the root ids[t], then ids[t + 1] is next
        root_alone = Proposal(ids[t:t + 1], shape_layout((-1,), (-1,)))
        verified = verify(decoder.model, cache, root_alone, Sampling(), None, drafter.capture)
        verified.seconds = {"draft": 0.0, "verify": 0.0}
        drafter.accept(root_alone, verified)
        drafter.propose(int(ids[t + 1]))
        assert drafter.draft_cache.length == t + 1 and cache.length == t + 1
    whole = Eagle3Drafter(decoder, decoder.model.new_cache(64), nodes=8, beam=2, depth=4)
    whole.prefill(ids[:8])
    whole._read_verified(int(ids[8]))
    assert torch.allclose(drafter.draft_cache.k[..., :8], whole.draft_cache.k[..., :8], atol=1e-10)


def test_growth_stops_where_no_deeper_guess_would_be_verified(tiny_f64):
    """With the step's cost, the draft stops at the level below which no proposal could pay for its row: it
    drafts fewer levels, and the tree it verifies is the one it verifies when it drafts every level."""
    model, tok = tiny_f64
    vocab = torch.arange(VOCAB)
    tensors = _draft_tensors(model, vocab, 3, 0.3)
    tensors["lm_head.weight"] = 10 * tensors["lm_head.weight"]  # a confident draft: trees of 1-8 proposals
    decoder = _decoder(model, tok, tensors, vocab, torch.float64)
    rng = random.Random(4)
    shallower = verified = 0
    for trial in range(60):
        ids = torch.tensor([rng.randrange(VOCAB) for _ in range(6)])
        b1 = 10 ** rng.uniform(-5, -3)  # a row costs 1/1000 to 1/10 of a step's forward
        cost = StepCost([0.01 + b1 * rows for rows in range(17)], rng.uniform(0.5, 1.0), 0.002)
        trees, depths = [], []
        for step_cost in (cost, None):
            drafter = Eagle3Drafter(decoder, decoder.model.new_cache(64), nodes=16, beam=3, depth=5)
            drafter.prefill(ids[:5])
            found = drafter.grow(int(ids[5]), 15, step_cost)
            chosen = by_value(found, 15)
            chosen = chosen[:cost.count([found.values[i] for i in chosen])]
            trees.append([(found.tokens[i], found.parents[i], found.depths[i]) for i in chosen])
            depths.append(max(found.depths))
        assert trees[0] == trees[1], trial
        shallower += depths[0] < depths[1]
        verified += len(trees[0])
    assert shallower >= 30 and verified >= 150


@pytest.mark.parametrize("path", ["native", "native-q4", "native-bf16", "pytorch", "pytorch-fixed"])
def test_random_and_poisoned_drafts_cannot_change_greedy_output(path, monkeypatch):
    """native-q4: 4-bit blocks on the int8 kernel, what auto runs SmolLM2's drafts on where the CPU has VNNI;
    native-bf16: bfloat16 weights; on both the draft's matrices in Q4_1 blocks where the CPU has VNNI
    (ppdkit/runtime/decoder_loading.draft_matrices, head_loading.EAGLE3_BLOCK_BITS)."""
    model, tok = tiny_model_on(path.removesuffix("-q4").removesuffix("-bf16"), monkeypatch)
    weights = q4_weights_or_skip(model) if path == "native-q4" else {}
    kernels = linear_module.native_kernels()  # tiny_model_on's: the native module, or None for PyTorch's layers
    if path == "native-bf16":
        model = model.bfloat16()
    rng = random.Random(0)
    vocab = torch.arange(3, VOCAB, 3)
    for case, value in enumerate((None, math.nan, math.inf, -math.inf, 1e30)):
        tensors = _draft_tensors(model, vocab, case, scale=rng.choice([0.1, 3.0]))
        if value is not None:
            name = sorted(tensors)[case % len(tensors)]
            tensors[name] = torch.full_like(tensors[name], value)
        decoder = _decoder(model, tok, tensors, vocab, **weights)
        decoder.fix_shapes(path == "pytorch-fixed")  # a GPU's steps (ppdkit/runtime/forward/fixed_shapes.py)
        assert (decoder.model.native is not None) == path.startswith("native")  # the path under test really runs
        assert decoder.model.weight_format == ("q4" if weights else "bfloat16" if path == "native-bf16" else "float32")
        if path in ("native-bf16", "native-q4"):  # every matrix of the draft in Q8_0 blocks where the int8 kernel
            matrices = [w for w in decoder.draft.eagle3.weights.values() if isinstance(w, linear_module.Linear)]  # runs
            assert all(w.weight is None for w in matrices) == kernels.quantized_available()
            assert decoder.draft.eagle3.native_weights
        for seed in range(3):
            ids = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 16))] * rng.choice([1, 3])
            plain = decoder.generate(ids, max_new_tokens=24, method="ar").tokens
            for method in EAGLE3:
                assert decoder.generate(ids, max_new_tokens=24, method=method).tokens == plain, (case, seed, method)


def test_eagle3_reproduces_transformers_greedy_in_float64(tiny_f64):
    """Random drafts in float64 against transformers' greedy; repeated prompts, so the n-gram chain is accepted
    and multi-token steps refill the draft cache from the kept path."""
    model, tok = tiny_f64
    rng = random.Random(5)
    emitted = steps = 0
    for case in range(12):
        vocab = torch.tensor(sorted(rng.sample(range(VOCAB), rng.choice([16, 128, VOCAB]))))
        decoder = _decoder(model, tok, _draft_tensors(model, vocab, case, rng.choice([0.01, 0.5])), vocab,
                           torch.float64)
        ids = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 10))] * rng.choice([1, 4])
        budget = rng.randint(1, 40)
        truth = hf_greedy(model, ids, budget)
        for method in EAGLE3:
            out = decoder.generate(ids, max_new_tokens=budget, method=method)
            assert out.tokens == truth[:len(out.tokens)] and len(out.tokens) in (budget, len(truth)), (case, method)
            emitted, steps = emitted + len(out.tokens), steps + out.steps
    assert emitted > steps  # some steps kept more than one token: the draft cache was refilled from long paths


def test_sampled_eagle3_draws_the_base_models_first_tokens(tiny_f64):
    """Sampled decoding through EAGLE-3's tree (speculative acceptance): the first two new tokens follow the
    model's own distributions (the repeated prompt's n-gram chain rides in the tree, so guesses are accepted)."""
    model, tok = tiny_f64
    vocab = torch.arange(VOCAB)
    decoder = _decoder(model, tok, _draft_tensors(model, vocab, 6, 0.01), vocab, torch.float64)
    first_two_tokens_follow_the_model(decoder, [5, 17, 42, 5, 17, 42, 5, 17], "eagle3-anpd")


def test_auto_precision_trains_in_whichever_this_cpu_runs_faster(caplog):
    """train.precision auto times the draft layer's product both ways once per process and keeps the faster; the
    named precisions are taken as they are; auto and bf16-autocast are eagle3's only."""
    import logging

    from ppdkit.trainer import autocast_probe

    autocast_probe._autocast_is_faster.cache_clear()
    cpu = torch.device("cpu")
    assert not use_autocast("fp32", cpu) and use_autocast("bf16-autocast", cpu)
    with caplog.at_level(logging.INFO, logger="ppdkit.trainer.autocast_probe"):
        chosen = use_autocast("auto", cpu)
        assert use_autocast("auto", cpu) == chosen
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and ("auto: bf16-autocast" if chosen else "auto: fp32") in said[0], said  # timed once
    for precision in ("auto", "bf16-autocast"):
        with pytest.raises(ValueError, match=f"train.precision {precision} is eagle3's"):
            TrainConfig(method="feature-head", precision=precision)


def test_top1_share_moves_the_target_onto_the_teachers_top1_and_its_gradient_follows():
    """train.top1_share: the target is (1 - share) x the teacher's distribution + share x its top-1 (column 0), a
    distribution still; a top-1 outside the draft vocabulary leaves the distribution as it is; 0 is EAGLE-3's loss."""
    from ppdkit.trainer.losses import soft_cross_entropy, with_top1_share

    index = torch.tensor([[[3, 1, 4]], [[-1, 2, 0]]])  # [N 2, 1, K 3]: the second's top-1 is outside the vocabulary
    probs = torch.tensor([[[0.5, 0.3, 0.2]], [[0.0, 0.6, 0.4]]])
    mixed = with_top1_share(index, probs, 0.25)
    assert torch.allclose(mixed[0], torch.tensor([[0.625, 0.225, 0.15]])) and torch.equal(mixed[1], probs[1])
    assert torch.allclose(mixed.sum(-1), torch.ones(2, 1)) and with_top1_share(index, probs, 0.0) is probs
    logits = torch.zeros(2, 1, 5, requires_grad=True)  # [N, D, V']: a uniform draft
    soft_cross_entropy(logits.log_softmax(-1), index, mixed).sum().backward()
    assert logits.grad[0, 0].argmin() == 3  # the top-1's logit is pushed up hardest
    with pytest.raises(ValueError, match="top1_share"):
        TrainConfig(method="eagle3", top1_share=1.5)
    base = load_base_model("tiny-llama", quantization="none", dtype="float32")
    ids = torch.tensor([random.Random(1).randrange(VOCAB) for _ in range(12)])
    g = torch.Generator().manual_seed(0)
    seq = ShardSequence(0, ids, torch.arange(11), torch.randint(0, VOCAB, (11, 4), generator=g),
                        torch.randn(11, 4, generator=g).log_softmax(-1), torch.zeros(11))
    runs = [TRAINING_METHODS["eagle3"].start(TrainConfig(method="eagle3", head_depth=2, draft_vocab=VOCAB,
                                                         top1_share=share), base, [seq]) for share in (0.0, 0.5)]
    with torch.no_grad():
        trained = [r.loss(r.module, [seq], random.Random(0), 0)[0] for r in runs]
        scored = [r.evaluate(r.module, [seq], 0) for r in runs]
    assert not torch.allclose(trained[0], trained[1])  # the share trains on another target
    assert scored[0] == scored[1]  # held-out figures are to the teacher's distribution, whatever the share


def test_eagle3_trains_on_two_ray_workers_and_its_component_decodes(teacher_dir, tmp_path):
    # the first visits write the states, from two ranks at once (the other method tests train on one, in-process)
    on_disk = EAGLE3_TRAIN.model_copy(update={"features_on_disk": True, "num_workers": 2})
    result = run_training(BASE, on_disk, teacher_dir, tmp_path / "train", TrackerRef())
    losses = [loss for _, loss in result["history"]]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    assert set(result["best"]) >= {"acc_top1_d1", "acc_top1_d3", "loss_d2"}
    written = list((teacher_dir / "base-states").glob("layers-1-1-1.*/*/*.safetensors"))  # by both workers
    assert len(written) >= 2 * 2 * on_disk.micro_batch and not list(teacher_dir.rglob("*.partial"))
    base = load_base_model("tiny-llama")
    component = read_component(tmp_path / "train" / "component", expect_fingerprint=base.fingerprint)
    assert component.method == "eagle3" and component.hyperparameters["aux_layers"] == [1, 1, 1]
    assert component.hyperparameters["precision"] in ("fp32", "bf16-autocast")  # auto, as the workers resolved it
    assert component.tensors["fc.weight"].shape == (64, 192) and component.tensors["lm_head.weight"].shape == (128, 64)
    decoder = Decoder.from_pretrained(tmp_path / "train" / "component", dtype="float32", tree_size=None)
    assert set(EAGLE3) <= set(decoder.methods()) and decoder.profile["sizes"] == [2, 4, 8]  # the latency profile
    ids = [5, 17, 99, 5, 17, 99, 5, 17]
    assert decoder.generate(ids, max_new_tokens=16, method="eagle3-anpd").tokens == decoder.generate(ids,
                            max_new_tokens=16, method="ar").tokens
    fixed = Decoder.from_pretrained(tmp_path / "train" / "component", dtype="float32", tree_size=24)
    out = fixed.generate(ids, max_new_tokens=16, method="eagle3")
    assert out.tokens == decoder.generate(ids, max_new_tokens=16,
                                          method="ar").tokens and set(out.rows_per_step) == {24}  # every tree full
    broken = tmp_path / "broken"
    import shutil

    shutil.copytree(tmp_path / "train" / "component", broken)
    import json

    meta = json.loads((broken / "component.json").read_text())
    meta["hyperparameters"]["aux_layers"] = [2, 1, 7]
    (broken / "component.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match="aux_layers must name 3 of the base model's hidden states"):
        Decoder.from_pretrained(broken, dtype="float32")
