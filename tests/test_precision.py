"""The runtime's precision (ppdkit/runtime/forward/precision.py) and the property its losslessness rests on: the native
kernels' result for a row never depends on how many rows share the call (ppdkit/runtime/forward/row_invariance.py), on
every instruction path this CPU has, in float32 and bfloat16 (AVX512-BF16 dot products, float32 FMAs in AVX-512's and
AVX2's panels, and AMX tiles where the CPU has them); the vector kernels equal their PyTorch twin bit for bit, the AMX
one lies within float32 summation's bound of it; every decoding method gives `ar`'s tokens in bfloat16 on every kernel
and on 4-bit blocks; `auto` picks bfloat16 only where its kernels run."""

import logging
import random

import pytest
import torch
from conftest import kernels_or_skip, q4_weights_or_skip
from test_draft_heads import _decoder, _heads, _random_tree
from test_lossless import _random_early_head, _random_p

import ppdkit.runtime.forward.linear as linear_module
import ppdkit.runtime.forward.row_invariance as row_invariance
from ppdkit.data_pipeline.ngram_cache import build_ngram_table
from ppdkit.models.tiny import build_tiny_llama
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.draft_parts import PromptTokenParts
from ppdkit.runtime.kernels.twin import bf16_linear_twin
from ppdkit.runtime.decoder_loading import draft_matrices
from ppdkit.runtime.forward.linear import QUANTIZED, SKINNY_MAX_ROWS, Linear
from ppdkit.runtime.forward.llama import LeanLlama
from ppdkit.runtime.kernels.native import FMA_ROWS_TRIED, NEVER, bf16_fma_rows, tune_bf16_fma
from ppdkit.runtime.drafters.ppd import PromptTokenSet
from ppdkit.runtime.forward.precision import resolve_dtype
from ppdkit.runtime.trees.tree import best_tree_for_size

ROWS = 80  # the most rows the tests put through one call: past the largest tree with its prompt tokens
SHAPES = [(100, 37), (64, 576), (49, 16)]  # odd K, a model's width, fewer columns than a panel pair


def _bf16_kernels(variant: str = "native"):
    module = kernels_or_skip(variant)
    assert module.bf16_available()  # every build multiplies bfloat16 weights (float32 FMAs at least)
    return module


def _bf16_kernel(kernel: str, monkeypatch):
    """The native module whose bfloat16 kernel is `kernel` (ppdkit/runtime/kernels/native.bf16_kernel: amx, avx512, or
    avx2, from the AVX2 build on an AVX-512 machine), with bfloat16 weights packed for it in this test; skipped where
    the CPU lacks it."""
    module = _bf16_kernels("avx2" if kernel == "avx2" else "native")
    if kernel == "amx" and not module.amx_available():
        pytest.skip("this CPU has no AMX-BF16 tiles")
    if kernel == "avx512" and module.vector_kernel() != "avx512":
        pytest.skip("this CPU has no AVX-512")
    monkeypatch.setenv("PPDKIT_BF16_KERNEL", kernel)
    return module


def _vdpbf16ps_kernels():
    """The native module where it has AVX512-BF16's dot products (VDPBF16PS), to hold them to its FMA path."""
    module = _bf16_kernels()
    if not module.bf16_dot_available():
        pytest.skip("this CPU has no AVX512-BF16: its bfloat16 kernel runs on FMAs only")
    return module


PATHS = [("native", torch.float32), ("avx2", torch.float32), ("avx512", torch.bfloat16), ("avx2", torch.bfloat16),
         ("amx", torch.bfloat16)]


def _path(variant: str, dtype: torch.dtype, monkeypatch):
    """The native module of a (build or bfloat16 kernel, dtype) path, put where Linear finds it."""
    module = _bf16_kernel(variant, monkeypatch) if dtype == torch.bfloat16 else kernels_or_skip(variant)
    monkeypatch.setattr(linear_module, "native_kernels", lambda: module)
    return module


@pytest.mark.parametrize("variant,dtype", PATHS)
def test_every_row_is_the_same_whatever_the_rows_in_the_call(variant, dtype, monkeypatch):
    """1 to 80 rows of random weights: each row's result is bit for bit its one-row result, on each build."""
    module = _path(variant, dtype, monkeypatch)
    g = torch.Generator().manual_seed(0)
    for out_features, in_features in SHAPES:
        layer = Linear(torch.randn(out_features, in_features, generator=g).to(dtype))
        assert layer.native is module and layer.panels.dtype == dtype
        assert layer.kernel == (variant if dtype == torch.bfloat16 else None)
        x = torch.randn(ROWS, in_features, generator=g)
        single = torch.cat([layer(x[i:i + 1]) for i in range(ROWS)])
        for rows in range(1, ROWS + 1):
            assert torch.equal(layer(x[:rows]), single[:rows]), (out_features, in_features, rows)


@pytest.mark.parametrize("variant", ["native", "avx2"])
def test_the_bfloat16_kernel_equals_its_pytorch_twin(variant):
    """The native bfloat16 matmul (AVX512-BF16's dot products, or float32 FMAs where the CPU has none; the AVX2
    build's 8-column panels) rounds exactly as ppdkit/runtime/kernels/twin.py writes it down, and lies within
    bfloat16's rounding of the float32 product."""
    module = _bf16_kernels(variant)
    g = torch.Generator().manual_seed(1)
    for out_features, in_features in SHAPES:
        weight = torch.randn(out_features, in_features, generator=g).bfloat16()
        x = torch.randn(13, in_features, generator=g)
        x[1] = 0.0
        x[1, :2] = torch.tensor([2e-39, -1e-39])  # denormals: read as zeros, as VDPBF16PS reads them
        packed, twin = module.pack(weight, module.vector_kernel()), bf16_linear_twin(x, weight)
        for rows in range(1, 14):  # every register blocking of a pass
            assert torch.equal(module.linear(x[:rows], packed, out_features), twin[:rows]), (in_features, rows)
        exact = x.double() @ weight.double().T
        assert torch.allclose(twin.double(), exact, atol=0.05 * in_features ** 0.5, rtol=0.02)


def test_the_amx_kernel_sums_the_twins_products_within_float32s_bound(monkeypatch):
    """AMX tiles round inside a k-block in their own way (no bit-for-bit twin), so they are held to the exact sum of
    the twin's bfloat16 products: within K float32 roundings of it, |error| <= K 2^-24 sum |x w|. A wrong panel,
    tile or padding breaks this by orders of magnitude."""
    module = _bf16_kernel("amx", monkeypatch)
    g = torch.Generator().manual_seed(4)
    for out_features, in_features in [*SHAPES, (1536, 576), (576, 1536)]:
        weight = torch.randn(out_features, in_features, generator=g).bfloat16()
        x = torch.randn(40, in_features, generator=g)  # two x tiles: rows 0-15 and 16-39
        native = module.linear(x, module.pack(weight, "amx"), out_features).double()
        xb, wb = x.bfloat16().double(), weight.double()
        exact, magnitude = xb @ wb.T, xb.abs() @ wb.abs().T
        assert ((native - exact).abs() <= in_features * 2.0 ** -24 * magnitude).all(), (out_features, in_features)
        twin = bf16_linear_twin(x[:3], weight).double()
        assert not torch.equal(native[:3], twin) or in_features < 32  # a path of its own, not the twin's rounding


def test_a_bfloat16_kernel_the_cpu_lacks_or_misspelled_is_refused(monkeypatch):
    module = _bf16_kernels()
    monkeypatch.setenv("PPDKIT_BF16_KERNEL", "tiles")
    with pytest.raises(ValueError, match="PPDKIT_BF16_KERNEL must be one of auto, amx, avx512, avx2, not 'tiles'"):
        Linear(torch.randn(32, 32).bfloat16())
    monkeypatch.setenv("PPDKIT_BF16_KERNEL", "auto")
    vector = module.vector_kernel()
    assert Linear(torch.randn(32, 32).bfloat16()).kernel == ("amx" if module.amx_available() else vector)
    other = {"avx512": "avx2", "avx2": "avx512"}[vector]  # the vector kernel this build is not for
    monkeypatch.setenv("PPDKIT_BF16_KERNEL", other)
    with pytest.raises(ValueError, match=f"the native kernels are built for {vector} on this CPU"):
        Linear(torch.randn(32, 32).bfloat16())
    with pytest.raises(RuntimeError, match=f"this build's vector panels are {vector}'s"):
        module.pack(torch.randn(32, 32).bfloat16(), other)
    if not module.amx_available():
        monkeypatch.setenv("PPDKIT_BF16_KERNEL", "amx")
        with pytest.raises(ValueError, match="no AMX-BF16 tiles"):
            Linear(torch.randn(32, 32).bfloat16())


@pytest.fixture
def fma_rows():
    """Sets from how many rows the AVX512-BF16 path runs on float32 FMAs, for one test; the process's own value is
    put back after."""
    module = _vdpbf16ps_kernels()
    tune_bf16_fma(module)  # timed first, so that a Linear built in the test leaves the test's value
    saved = module.bf16_fma_from_rows()
    yield module
    module.bf16_fma_from_rows(saved)


# VDPBF16PS for every call, FMAs for every call, and mixed: 1-2 rows on VDPBF16PS, 3 or more on FMAs
FMA_THRESHOLDS = [NEVER, 1, 3]


@pytest.mark.parametrize("threshold", FMA_THRESHOLDS)
def test_the_bfloat16_fma_path_gives_the_dot_products_bits(threshold, fma_rows):
    """Both ways of the AVX512-BF16 path give the twin's bits for every row count 1-40, denormal inputs included
    (VDPBF16PS reads them as zeros; the FMAs run with DAZ and FTZ set, so they do too): which way a call takes may
    then depend on its rows without a row's result depending on them."""
    module = fma_rows
    module.bf16_fma_from_rows(threshold)
    g = torch.Generator().manual_seed(5)
    for out_features, in_features in SHAPES:
        weight = torch.randn(out_features, in_features, generator=g)
        weight[0] = 1e-39  # denormal in bfloat16 as in float32: output 0 sums only products read as zeros
        weight = weight.bfloat16()
        x = torch.randn(40, in_features, generator=g)
        x[1] = 0.0
        x[1, :2] = torch.tensor([2e-39, -1e-39])  # and so does row 1
        twin = bf16_linear_twin(x, weight)
        packed = module.pack(weight, "avx512")
        for rows in range(1, 41):
            assert torch.equal(module.linear(x[:rows], packed, out_features), twin[:rows]), (in_features, rows)


def test_the_native_decoder_layers_are_row_invariant_across_the_two_bfloat16_ways(fma_rows, monkeypatch):
    """The tiny model's steps of 1 and 2 rows on VDPBF16PS, of 3 or more on FMAs: each row still gets exactly what
    one-row steps give it."""
    fma_rows.bf16_fma_from_rows(3)
    _path("avx512", torch.bfloat16, monkeypatch)
    model, _ = build_tiny_llama()
    lean = LeanLlama(model.to(torch.bfloat16).eval(), 256)
    assert row_invariance.first_mismatch(lean, ROWS) is None


def test_the_fma_threshold_is_timed_here_or_set_by_the_environment(monkeypatch):
    module = _vdpbf16ps_kernels()
    monkeypatch.setenv("PPDKIT_BF16_FMA_ROWS", "5")
    assert bf16_fma_rows(module) == 5
    monkeypatch.setenv("PPDKIT_BF16_FMA_ROWS", "never")
    assert bf16_fma_rows(module) == NEVER
    for wrong in ("0", "four", "-2"):
        monkeypatch.setenv("PPDKIT_BF16_FMA_ROWS", wrong)
        with pytest.raises(ValueError, match="PPDKIT_BF16_FMA_ROWS must be a number of rows"):
            bf16_fma_rows(module)
    monkeypatch.delenv("PPDKIT_BF16_FMA_ROWS")
    saved = module.bf16_fma_from_rows()
    assert bf16_fma_rows(module) in (*FMA_ROWS_TRIED, NEVER)
    assert module.bf16_fma_from_rows() == saved  # the timing puts the process's value back


@pytest.mark.parametrize("variant,dtype", PATHS)
def test_the_native_decoder_layers_are_row_invariant(variant, dtype, monkeypatch):
    """A causal step of n rows over a cache gives each row exactly what n one-row steps give (attention, softmax,
    SwiGLU and the norms included), n = 1..80, on the tiny model."""
    _path(variant, dtype, monkeypatch)
    model, _ = build_tiny_llama()
    lean = LeanLlama(model.to(dtype).eval(), 256)
    assert lean.native is not None and lean.weight_dtype == dtype and lean.dtype == torch.float32
    assert row_invariance.first_mismatch(lean, ROWS) is None


@pytest.mark.parametrize("variant,dtype", [*PATHS, ("native", "q4")])
def test_a_prompt_longer_than_a_native_call_reads_as_one_token_at_a_time(variant, dtype, monkeypatch):
    """A prompt of more rows than one native call takes (ppdkit/runtime/forward/llama.native_blocks) gives every
    position the hidden state and the keys/values that reading it one token at a time gives: ar's prefill is its
    decoding's arithmetic, whatever the prompt's length."""
    _path(variant, torch.float32 if dtype == "q4" else dtype, monkeypatch)
    model, _ = build_tiny_llama()
    weights = q4_weights_or_skip(model) if dtype == "q4" else {}
    lean = LeanLlama(model.to(torch.float32 if weights else dtype).eval(), 400, **weights)
    assert lean.native is not None
    n = 2 * SKINNY_MAX_ROWS + 37
    x = torch.randn(n, lean.hidden, generator=torch.Generator().manual_seed(5))
    whole, alone = lean.new_cache(n), lean.new_cache(n)
    at_once = lean.forward(x, torch.arange(n), whole, None)
    one_by_one = []
    for i in range(n):
        one_by_one.append(lean.forward(x[i:i + 1], torch.tensor([i]), alone, None)[0])
        alone.commit(None, 1)
    assert torch.equal(at_once, torch.stack(one_by_one))
    assert torch.equal(whole.k[..., :n], alone.k[..., :n]) and torch.equal(whole.v[:, :, :n], alone.v[:, :, :n])


def _bf16_tiny(module, monkeypatch):
    monkeypatch.setattr(linear_module, "native_kernels", lambda: module)
    model, tok = build_tiny_llama()
    return model.bfloat16().eval(), tok


NARROW = ["bfloat16-avx512", "bfloat16-avx2", "bfloat16-amx", "q4"]  # bfloat16 on each kernel, and 4-bit blocks


def _narrow_weights(weights: str, monkeypatch):
    """The tiny model and the Decoder arguments that put its matmuls on `weights`' native kernel: bfloat16 on AMX
    tiles or AVX512-BF16, or q4 (Q4_1 blocks quantized from its float32 weights, the int8 kernel)."""
    if weights.startswith("bfloat16"):
        module = _bf16_kernel(weights.removeprefix("bfloat16-"), monkeypatch)
        return *_bf16_tiny(module, monkeypatch), {}
    model, tok = build_tiny_llama()
    return model.eval(), tok, q4_weights_or_skip(model)


@pytest.mark.parametrize("weights", NARROW)
def test_every_method_gives_ars_tokens_on_narrow_weights(weights, monkeypatch):
    """bfloat16 weights, or 4-bit blocks, on the native kernels: ppd, ppd-lookup, ppd-head, ppd-prune, anpd and
    self-draft give ar's tokens on the same weights, with random prompt tokens and trees, and lookup tables that
    know ar's continuation (so long paths are accepted and the cache is pruned in every way)."""
    model, tok, narrow = _narrow_weights(weights, monkeypatch)
    rng, g = random.Random(2), torch.Generator().manual_seed(2)
    steps = emitted = 0
    for case in range(8):
        k, n = rng.randint(1, 3), rng.randint(1, 2)
        head = (torch.randn(64, 64, generator=g) / 8, torch.randn(64, generator=g))
        prompts = PromptTokenSet(torch.randn(k * n, 64, generator=g), None, k, n,
                                 rng.choice(["ensemble", "decoder", "encoder"]), head)
        tree = best_tree_for_size(_random_p(rng, k), rng.choice([8, 16, 32, 64]), n)
        plain = Decoder(model, tok, None, **narrow)
        assert plain.model.native is not None and plain.model.weight_format == weights.split("-")[0]
        assert plain.model.kernel == (weights.split("-")[1] if "-" in weights else None)
        ids = [rng.randrange(3, 40) for _ in range(rng.randint(2, 30))]
        truth = plain.generate(ids, max_new_tokens=32, method="ar").tokens
        table = build_ngram_table([ids + truth] * 2, max_n=3, branches=3, length=6)
        parts = PromptTokenParts.of_tree(prompts, tree, ngrams=table, lookup_chains=rng.randint(1, 2))
        decoder = Decoder(model, tok, parts, **narrow)
        decoder.draft.early_head = _random_early_head(g, model, rng.choice([1, 8, 384]))
        for method in ("ar", "ppd", "ppd-lookup", "ppd-head", "ppd-prune", "anpd", "self-draft"):
            out = decoder.generate(ids, max_new_tokens=32, method=method)
            assert out.tokens == truth, (case, method)
            if method == "ppd-lookup":
                steps, emitted = steps + out.steps, emitted + len(out.tokens)
    assert emitted / steps > 1.3  # chains were accepted: multi-row steps decided the output


@pytest.mark.parametrize("weights", NARROW)
def test_draft_heads_give_ars_tokens_on_narrow_weights(weights, monkeypatch):
    """Random feature and Medusa heads over bfloat16 weights or 4-bit blocks, with trees of up to 64 nodes; their
    matrices in Q8_0 blocks where the CPU has VNNI, as the loader puts them (ppdkit/runtime/decoder_loading.draft_matrices)."""
    model, tok, narrow = _narrow_weights(weights, monkeypatch)
    rng, g = random.Random(3), torch.Generator().manual_seed(3)
    matrices = draft_matrices(weights.split("-")[0])
    assert (matrices == QUANTIZED) == linear_module.native_kernels().quantized_available()
    for case in range(6):
        kind, depth = ("feature", "medusa")[case % 2], rng.randint(1, 4)
        heads = _heads(kind, depth, g, model, torch.arange(3, 384, 2), scale=0.5, matrices=matrices)
        layers = (heads.readout, *(heads.layers if kind == "feature" else ()))
        assert all((layer.weight is None) == (matrices == QUANTIZED) for layer in layers)  # None: Q8_0 blocks
        decoder = _decoder(model, tok, heads, _random_tree(rng, depth, rng.choice([8, 32, 64])), **narrow)
        ids = [rng.randrange(3, 384) for _ in range(rng.randint(1, 20))]
        ar = decoder.generate(ids, max_new_tokens=24, method="ar").tokens
        methods = ("feature-head", "feature-grown", "feature-grown-anpd") if kind == "feature" else ("medusa",)
        for method in methods:
            assert decoder.generate(ids, max_new_tokens=24, method=method).tokens == ar, (case, method)


def test_auto_picks_bfloat16_only_where_its_kernels_run(monkeypatch, caplog):
    module = kernels_or_skip("native")
    monkeypatch.setattr(linear_module, "native_kernels", lambda: module)
    assert resolve_dtype("auto") == ("bfloat16" if module.bf16_available() else "float32")
    assert resolve_dtype("float32") == "float32"
    monkeypatch.setattr(linear_module, "native_kernels", lambda: None)  # no kernels: no AVX-512, no compiler
    with caplog.at_level(logging.INFO, logger="ppdkit.runtime.forward.precision"):
        assert resolve_dtype("auto") == "float32"
        assert resolve_dtype("bfloat16") == "float32"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "float32" in said[0] and "neither AVX-512 nor AVX2" in said[1], said
    assert resolve_dtype("bfloat16", "cuda") == "bfloat16"  # a GPU runs bfloat16 on its own matmuls
    with pytest.raises(ValueError, match="dtype must be one of auto, float32, bfloat16"):
        resolve_dtype("fp16")


def test_a_decoder_whose_kernels_are_not_row_invariant_is_refused(monkeypatch, tiny_dir):
    """Where a step of n rows would differ from n one-row steps, loading names n and what to do."""
    calls = []

    def differs_at_24(model, rows):
        calls.append(rows)
        return 24

    monkeypatch.setattr(row_invariance, "first_mismatch", differs_at_24)
    with pytest.raises(ValueError, match="step of 24 rows.*--tree-size.*float32"):
        Decoder.from_base("tiny-llama")
    assert calls and calls[0] >= 2  # the rows of the decoder's largest step were checked


def test_a_gpu_decoder_whose_kernels_are_not_row_invariant_is_warned_about(monkeypatch, caplog):
    """A GPU runs the PyTorch layers, whose cuBLAS matmuls differed between row counts on an H200 (without fixed
    shapes): the check runs there too and warns, naming the device and the remedy, instead of passing in silence or
    refusing every tree method."""
    from types import SimpleNamespace

    monkeypatch.setattr(row_invariance, "first_mismatch", lambda model, rows: 8)
    model = SimpleNamespace(weight_format="bfloat16", native=None, fixed_rows=None)
    decoder = SimpleNamespace(device=torch.device("cuda"), model=model,
                              methods=lambda: ["ar", "ppd"], step_rows=lambda method: 1 if method == "ar" else 16)
    with caplog.at_level("WARNING", logger=row_invariance.__name__):
        row_invariance.check_rows(decoder)
    assert "step of 8 rows" in caplog.text and "on cuda" in caplog.text and "differ from ar's" in caplog.text
    assert "fixed_shapes=True" in caplog.text  # the remedy: steps of one shape (ppdkit/runtime/forward/fixed_shapes.py)
    caplog.clear()
    model.fixed_rows = 96  # where even those differ, it says so
    with caplog.at_level("WARNING", logger=row_invariance.__name__):
        row_invariance.check_rows(decoder)
    assert "in steps of one shape" in caplog.text and "fixed_shapes=True" not in caplog.text


def test_the_precision_report_compares_answers_and_perplexity(tiny_dir, monkeypatch):
    """`ppdkit precision` on the tiny model: a dtype against itself agrees everywhere; bfloat16 against float32 is
    counted answer by answer, with a perplexity near float32's."""
    from pathlib import Path

    from ppdkit.bench.decoding import first_difference
    from ppdkit.bench.precision_cost import run_precision

    monkeypatch.setattr(linear_module, "native_kernels", _bf16_kernels)
    fixture = str(Path(__file__).parent / "fixtures" / "conversations.jsonl")
    same = run_precision("tiny-llama", fixture, 4, 12, fixture, 4, 64, ("float32", "float32"))
    assert same["equal"] == same["prompts"] == 4 and same["first_difference_min"] is None
    report = run_precision("tiny-llama", fixture, 4, 12, fixture, 4, 64)
    assert report["dtypes"] == ["float32", "bfloat16"] and report["prompts"] == 4 and report["text_tokens"] > 20
    for answer in report["answers"]:
        assert answer["equal"] == (answer["first_difference"] is None)
    ppl = report["perplexity"]
    assert ppl["float32"] == same["perplexity"]["float32"] and abs(ppl["bfloat16"] / ppl["float32"] - 1) < 0.05
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2 and first_difference([1, 2], [1, 2, 3]) == 2
