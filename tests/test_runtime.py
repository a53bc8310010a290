"""The bundled decoder on the tiny model in float64: exact forward, KV pruning, lossless PPD."""

import random
import time

import pytest
from pydantic import ValidationError
import torch
from conftest import hf_greedy, kernels_or_skip

from ppdkit.models.tiny import build_tiny_llama
import ppdkit.runtime.forward.linear as linear_module
from ppdkit.runtime.forward.causal_attention import causal_attention
from ppdkit.runtime.generate_options import GenerateOptions
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.draft_parts import PromptTokenParts
from ppdkit.runtime.forward.kv_cache import cache_width
from ppdkit.runtime.decoding_methods import LOOKUP_LENGTHS
from ppdkit.runtime.forward.linear import Linear
from ppdkit.runtime.forward.llama import LeanLlama, attention_bias
from ppdkit.runtime.drafters.lookup import ContextIndex
from ppdkit.runtime.kernels.native import native_kernels
from ppdkit.runtime.drafters.ppd import PromptTokenSet, ppd_step, prefill
from ppdkit.runtime.trees.profile import measure_latencies, profile_trees
from ppdkit.runtime.trees.tree import best_tree_for_size
from ppdkit.runtime.trees.tree_layout import layout_tree

P = [[0.5, 0.2, 0.1], [0.3, 0.1], [0.2]]


def _prompt(seed: int, length: int = 12) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 384, (length,), generator=g).tolist()


def test_lean_forward_equals_transformers_with_an_incremental_cache(tiny_f64):
    model, _ = tiny_f64
    lean = LeanLlama(model, 256)
    ids = torch.tensor(_prompt(1, 30))
    with torch.no_grad():
        ref = model(ids[None]).logits[0]
    cache = lean.new_cache(64)
    parts = []
    for a, b in [(0, 17), (17, 18), (18, 30)]:
        parts.append(lean.forward(lean.embed_ids(ids[a:b]), torch.arange(a, b), cache, None))
        cache.commit(None, b - a)
    assert torch.allclose(lean.logits(torch.cat(parts)), ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("length,block", [(0, 64), (0, 7), (5, 64), (5, 16)])
def test_causal_attention_in_blocks_equals_one_masked_product(length, block):
    """Prompt rows after `length` cached ones, in query blocks, against the full-width causal bias."""
    g = torch.Generator().manual_seed(length + block)
    hkv, group, t, d = 2, 3, 150, 8
    q = torch.randn(hkv, group, t, d, generator=g, dtype=torch.float64)
    keys, values = (torch.randn(hkv, length + t, d, generator=g, dtype=torch.float64) for _ in range(2))
    bias = attention_bias(None, length, t, group, torch.float64, torch.device("cpu"))  # [g T, S]
    scores = torch.baddbmm(bias, q.reshape(hkv, group * t, d), keys.transpose(1, 2), alpha=0.3)
    reference = torch.bmm(scores.softmax(-1), values).view(hkv, group, t, d)
    assert torch.allclose(causal_attention(q, keys, values, length, 0.3, block), reference, atol=1e-12, rtol=0)


def test_pruned_cache_equals_a_cache_built_from_the_kept_tokens(tiny_f64):
    model, _ = tiny_f64
    lean = LeanLlama(model, 256)
    ids = torch.tensor(_prompt(2, 10))
    tree = best_tree_for_size(P, 20, epts=1)
    prompts = PromptTokenSet(torch.randn(3, 64, dtype=torch.float64), None, 3, 1, "ensemble")
    layout = layout_tree(tree.states[3], 1, "ensemble")
    cache = lean.new_cache(128)
    root, guesses = prefill(lean, cache, ids, prompts, 3)
    step = ppd_step(lean, cache, prompts, layout, root, guesses, 3)
    kept = ids.tolist() + [root] + step.accepted
    fresh = lean.new_cache(128)
    lean.forward(lean.embed_ids(torch.tensor(kept)), torch.arange(len(kept)), fresh, None)
    fresh.commit(None, len(kept))
    assert cache.length == fresh.length == len(kept)
    assert torch.allclose(cache.k[..., :cache.length], fresh.k[..., :fresh.length], atol=1e-12)
    assert torch.allclose(cache.v[:, :, :cache.length], fresh.v[:, :, :fresh.length], atol=1e-12)


@pytest.mark.parametrize("k,n,mask,weighted", [(3, 1, "ensemble", False), (3, 2, "ensemble", False),
                                               (3, 2, "ensemble", True), (2, 2, "decoder", False),
                                               (3, 2, "encoder", False)])
def test_ppd_with_random_prompt_tokens_is_plain_greedy(tiny_f64, k, n, mask, weighted):
    model, tok = tiny_f64
    torch.manual_seed(k * 10 + n)
    weights = torch.softmax(torch.randn(k, n, dtype=torch.float64), -1) if weighted else None
    prompts = PromptTokenSet(torch.randn(k * n, 64, dtype=torch.float64), weights, k, n, mask)
    decoder = Decoder(model, tok, PromptTokenParts.of_tree(prompts, best_tree_for_size(P[:k], 8 + 8 * n, epts=n)))
    for seed in range(12):
        ids = _prompt(seed)
        ppd = decoder.generate(ids, max_new_tokens=32, method="ppd")
        assert ppd.tokens == decoder.generate(ids, max_new_tokens=32, method="ar").tokens == hf_greedy(model, ids,
                                              32)[:len(ppd.tokens)]


def test_accepted_guesses_stay_lossless(tiny_f64):
    """Guesses that are often right (taken from the true continuation) exercise acceptance and pruning."""
    model, _ = tiny_f64
    lean = LeanLlama(model, 512)
    prompts = PromptTokenSet(torch.randn(3, 64, dtype=torch.float64), None, 3, 1, "ensemble")
    tree = best_tree_for_size(P, 24, epts=1)
    layouts = {s: layout_tree(t, 1, "ensemble") for s, t in tree.states.items()}
    rng = random.Random(0)
    total_steps = total_tokens = 0
    for seed in range(8):
        ids = _prompt(seed, 8)
        truth = hf_greedy(model, ids, 60)
        cache = lean.new_cache(256)
        root, _ = prefill(lean, cache, torch.tensor(ids), prompts, 3)
        out, state = [root], 3
        while len(out) < 50:
            # guesses for the tokens after `root`: right at rank 0 or 1 most of the time, else wrong
            guesses = torch.randint(3, 384, (state, 3))
            for d in range(state):
                if rng.random() < 0.8:
                    guesses[d, rng.randrange(2)] = truth[len(out) + d]
            step = ppd_step(lean, cache, prompts, layouts[state], root, guesses, 3)
            out += step.accepted + [step.next_token]
            root, state = step.next_token, step.state
            total_steps += 1
            total_tokens += len(step.accepted) + 1
        assert out == truth[:len(out)]
    assert total_tokens / total_steps > 1.5  # guesses really were accepted


def test_generate_takes_one_typed_options_object_or_keyword_overrides(tiny_f64):
    model, tok = tiny_f64
    decoder = Decoder(model, tok)
    options = GenerateOptions(max_new_tokens=6, method="ar")
    by_object = decoder.generate([5, 6, 7], options)
    assert len(by_object.tokens) == 6 and by_object.method == "ar"
    assert decoder.generate([5, 6, 7], max_new_tokens=6, method="ar").tokens == by_object.tokens
    shorter = decoder.generate([5, 6, 7], options, max_new_tokens=3)  # a keyword overrides the object's value
    assert shorter.tokens == by_object.tokens[:3]
    with pytest.raises(ValueError, match="unknown generate option.s. temprature; the options are max_new_tokens"):
        decoder.generate([5, 6, 7], options, temprature=0.5)
    with pytest.raises(ValueError, match="max_new_tokens: Input should be greater than or equal to 1"):
        decoder.generate([5, 6, 7], options, max_new_tokens=0)
    with pytest.raises(TypeError, match="pass max_new_tokens and method by name"):
        decoder.generate([5, 6, 7], 6)
    with pytest.raises(ValidationError, match="frozen"):
        options.method = "anpd"  # an options object is a value: with_overrides makes another
    assert options.with_overrides(temperature=0.7).sampling.temperature == 0.7


def test_unknown_method_and_missing_trees_are_clear(tiny_f64):
    model, tok = tiny_f64
    decoder = Decoder(model, tok)
    with pytest.raises(ValueError, match="method ppd needs prompt tokens and calibrated trees, which this decoder's "
                                         "component does not carry; its methods: ar"):
        decoder.generate([5, 6, 7], max_new_tokens=4, method="ppd")
    with pytest.raises(ValueError, match="unknown decoding method 'eagle'; use one of ar, auto, anpd, self-draft, skip, "
                                         "skip-ft, ppd, ppd-lookup"):
        decoder.generate([5, 6, 7], max_new_tokens=4, method="eagle")
    with pytest.raises(ValueError, match="method medusa needs Medusa heads and a calibrated head tree"):
        decoder.generate([5, 6, 7], max_new_tokens=4, method="medusa")


def test_runtime_imports_no_ray_deepspeed_or_mlflow(tmp_path, tiny_dir):
    # (writing a model the first time goes through accelerate, which imports deepspeed: tiny_dir did that)
    import subprocess
    import sys

    code = ("import sys, torch; import ppdkit.runtime.decoder, ppdkit.runtime.trees.profile; "
            "from ppdkit.models.loading import load_base_model; load_base_model('tiny-llama'); "
            "print(sorted(m for m in ('ray', 'deepspeed', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("variant", ["native", "avx2", "onednn"])
def test_linear_paths_agree_with_torch(variant, monkeypatch):
    """The native few-rows kernel (AVX-512 or AVX2) and the oneDNN fallback, for every row count a step or
    a prefill can have, and shapes that are not multiples of the kernel's panels."""
    module = None if variant == "onednn" else kernels_or_skip(variant)
    monkeypatch.setattr(linear_module, "native_kernels", lambda: module)
    g = torch.Generator().manual_seed(0)
    for out_features, in_features in [(100, 37), (64, 576), (49, 16)]:
        weight = torch.randn(out_features, in_features, generator=g)
        layer = Linear(weight)
        assert layer.native is module and (layer.onednn is not None) == (module is None)
        if variant == "avx2":
            assert layer.panels.shape[-1] == 8  # 8-float panels: the AVX2 build, not AVX-512's 16
        for rows in [1, 2, 3, 5, 8, 9, 12, 13, 15, 16, 17, 31, 33, 64, 65]:
            x = torch.randn(rows, in_features, generator=g)
            assert torch.allclose(layer(x), x @ weight.T, atol=1e-4, rtol=1e-5), (out_features, in_features, rows)
        assert layer(torch.randn(2, 3, in_features, generator=g)).shape == (2, 3, out_features)


@pytest.mark.parametrize("variant", ["native", "avx2"])
def test_native_row_argmax_is_the_first_maximum(variant):
    """The greedy token of every verified row (kernels/row_argmax.cpp): the first maximum, as argmax's, for rows
    that are not multiples of the 16-lane vectors, ties in and across lanes, all -inf, and -1 for a row with a NaN
    (which PyTorch then decides)."""
    module = kernels_or_skip(variant)
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for rows, width in [(1, 1), (1, 15), (2, 16), (3, 17), (6, 49152), (5, 4099), (9, 33)]:
            logits = (torch.randn(rows, width, generator=g) * 2).round().to(dtype)  # few distinct values: ties
            assert torch.equal(module.row_argmax(logits), logits.argmax(-1)), (dtype, rows, width)
        tied = torch.zeros(2, 40, dtype=dtype)
        tied[0, [3, 19, 35]] = 1.0  # the same maximum in three lanes: the earliest wins
        tied[1] = -float("inf")
        assert module.row_argmax(tied).tolist() == [3, 0]
        nan = torch.zeros(3, 50, dtype=dtype)
        nan[0, 20], nan[2, 49] = float("nan"), float("nan")  # in the vector loop, in the tail
        assert module.row_argmax(nan).tolist() == [-1, 0, -1]
        strided = torch.randn(4, 64, generator=g).to(dtype)[:, :40]  # rows apart by more than their width
        assert torch.equal(module.row_argmax(strided), strided.argmax(-1))


@pytest.mark.parametrize("variant", ["native", "avx2"])
def test_native_decoder_layers_agree_with_the_pytorch_layers(variant, monkeypatch):
    """The one-call native layers (ppdkit/runtime/kernels/decoder_layers.cpp) against the same model's PyTorch
    layers: causal, tree-masked and single-token steps over a filled cache, keys and values included."""
    module = kernels_or_skip(variant)
    monkeypatch.setattr(linear_module, "native_kernels", lambda: module)
    model, _ = build_tiny_llama()
    lean = LeanLlama(model.float().eval(), 256)
    assert lean.native is not None
    g = torch.Generator().manual_seed(3)
    layers = len(lean.layers)
    # the last two: a layer-skip draft's sub-layers left out (bit 1 attention, bit 2 MLP), random per layer
    for t, masked, skip in [(1, False, []), (5, False, []), (6, True, []), (17, True, []),
                            (1, False, [i % 4 for i in range(layers)]), (4, True, [(i + 1) % 4 for i in range(layers)])]:
        caches = [lean.new_cache(64) for _ in range(3)]
        prompt = lean.embed_ids(torch.tensor(_prompt(t, 20)))
        for cache in caches:
            lean.forward(prompt, torch.arange(20), cache, None)  # prefill: PyTorch layers (20 rows)
            cache.commit(None, 20)
        x = torch.randn(t, lean.hidden, generator=g)
        mask = None
        if masked:
            mask = torch.cat([torch.ones(t, 20, dtype=torch.bool), torch.rand(t, t, generator=g) < 0.5], 1)
            mask[:, 20:] |= torch.eye(t, dtype=torch.bool)
        positions = 20 + torch.arange(t)
        cos, sin = lean.cos[positions][:, None], lean.sin[positions][:, None]
        bias = attention_bias(mask, 20, t, lean.group, lean.dtype, lean.device)
        native = lean.native.decoder_layers(x, lean.native_weights, lean.native_shape, lean.eps, cos[:, 0], sin[:, 0],
                                            bias, caches[0].k, caches[0].v, 20, skip, None)
        ours = lean._layers(x, cos, sin, bias, caches[1], 0, layers, tuple(skip))
        if skip:
            assert not torch.allclose(native, lean._layers(x, cos, sin, bias, caches[2], 0, layers)), t
        assert torch.allclose(native, ours, atol=1e-4, rtol=1e-4), (t, (native - ours).abs().max())
        for a, b in [(caches[0].k[..., :20 + t], caches[1].k[..., :20 + t]),
                     (caches[0].v[:, :, :20 + t], caches[1].v[:, :, :20 + t])]:
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError, match="float32 tensors only"):  # a clear error, not bad memory reads
        lean.native.decoder_layers(x.double(), lean.native_weights, lean.native_shape, lean.eps, cos[:, 0], sin[:, 0],
                                   bias, caches[0].k, caches[0].v, 20, [], None)


def test_float32_forward_agrees_with_transformers():
    """float32 takes the native kernel or oneDNN (prepacked weights); only summation order may differ."""
    model, tok = build_tiny_llama()
    model = model.float().eval()
    lean = LeanLlama(model, 256)
    assert all(layer.qkv.native is not None or layer.qkv.onednn is not None for layer in lean.layers)
    ids = torch.tensor(_prompt(4, 40))
    with torch.no_grad():
        ref = model(ids[None]).logits[0]
    cache = lean.new_cache(64)
    ours = lean.logits(lean.forward(lean.embed_ids(ids), torch.arange(len(ids)), cache, None))
    assert torch.allclose(ours, ref, atol=1e-4, rtol=0)
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
    prompts = PromptTokenSet(torch.randn(3, 64), None, 3, 1, "ensemble")
    decoder = Decoder(model, tok, PromptTokenParts.of_tree(prompts, best_tree_for_size(P, 16)))
    for seed in range(4):
        ids = _prompt(seed)
        ppd = decoder.generate(ids, max_new_tokens=24, method="ppd").tokens
        assert ppd == hf_greedy(model, ids, 24)[:len(ppd)]


def continuation(tokens: list[int], length: int) -> list[int]:
    return ContextIndex(tokens).continuation(length)


def test_context_lookup_by_hand():
    assert continuation([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]  # the 2-gram (5, 6) occurred at 0
    assert continuation([1, 2, 9, 1, 3, 9, 1], 2) == [3, 9]  # the latest (9, 1) wins
    assert continuation([4, 5, 6, 4], 3) == [5, 6, 4]  # only the 1-gram matches
    assert continuation([4, 5, 6, 7], 3) == []  # the last token never occurred before
    assert continuation([3, 3], 3) == [3, 3, 3]  # ran into the text's end: read as a loop
    assert continuation([7, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]  # (1, 2) 2 tokens back: a loop of period 2
    assert continuation([7, 1, 2, 8, 1, 2], 2) == [8, 1]
    assert continuation([], 3) == [] and continuation([4], 3) == []


def test_context_index_grown_token_by_token_matches_a_rescan():
    """The index, extended as decoding emits tokens, finds what scanning the whole text would."""
    def rescan(tokens, length):  # the latest earlier occurrence of the longest suffix, by brute force
        for n in range(min(3, len(tokens) - 1), 0, -1):
            starts = [s for s in range(len(tokens) - n) if tokens[s:s + n] == tokens[-n:]]
            if starts:
                found = tokens[starts[-1] + n:][:length]
                return (found * length)[:length]
        return []

    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        text = torch.randint(0, 2 + trial % 6, (60,), generator=g).tolist()  # small alphabets repeat often
        index = ContextIndex(text[:5])
        for end in range(5, len(text) + 1):
            assert index.continuation(4) == rescan(text[:end], 4)
            index.extend(text[end:end + 1])


def test_ppd_with_context_lookup_is_plain_greedy_and_uses_the_chain(tiny_f64):
    """Repetitive prompts make the lookup chain right often: accepted chains, states 0, longer chains."""
    model, tok = tiny_f64
    torch.manual_seed(7)
    prompts = PromptTokenSet(torch.randn(3, 64, dtype=torch.float64), None, 3, 1, "ensemble")
    decoder = Decoder(model, tok, PromptTokenParts.of_tree(prompts, best_tree_for_size(P, 12)))
    plain_steps = lookup_steps = longest = 0
    for seed in range(12):
        ids = _prompt(seed, 6) * 4  # a pattern the model's greedy output tends to continue
        with_lookup = decoder.generate(ids, max_new_tokens=40, method="ppd-lookup")
        plain = decoder.generate(ids, max_new_tokens=40, method="ppd")
        assert with_lookup.tokens == plain.tokens == hf_greedy(model, ids, 40)[:len(plain.tokens)]
        plain_steps += plain.steps
        lookup_steps += with_lookup.steps
        longest = max(longest, *with_lookup.accepted_per_step)
    assert lookup_steps < plain_steps  # the chain was accepted, and that saved steps
    assert longest > 4  # after a chain accepted whole, a longer one was (ppdkit/runtime/decoding_methods.py LOOKUP_LENGTHS)
    bound = decoder.step_rows("ppd-lookup")  # what the KV cache reserves for one step
    assert max(layout.size for layout in decoder.draft._lookup_layouts.values()) <= bound
    widest = max(decoder.draft.layouts, key=lambda state: decoder.draft.layouts[state].size)
    assert decoder.draft.lookup_layout(widest, 1, LOOKUP_LENGTHS[-1]).size == bound  # reachable, so not loose
    for acceptance in ("speculative", "typical"):  # sampled: a chain that ends a step leaves no guesses (state 0)
        sampled = decoder.generate(_prompt(1, 6) * 4, max_new_tokens=40, method="ppd-lookup", temperature=0.8,
                                   acceptance=acceptance, seed=3)
        assert 0 < len(sampled.tokens) <= 40 and sampled.steps <= len(sampled.tokens)


def test_hardware_profile_picks_the_best_measured_tau_per_latency_and_is_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    model, _ = build_tiny_llama()
    lean = LeanLlama(model.float().eval(), 512)
    taus = {4: 1.3, 8: 1.6, 16: 1.7}
    first = profile_trees(lean, taus, "sha256:" + "ab" * 32, context=32)
    best = max(first["rows"], key=lambda row: row["tau"] / row["latency_ms"])
    assert first["chosen"] == best["size"] and [row["size"] for row in first["rows"]] == [4, 8, 16]
    assert all(row["latency_ms"] > 0 for row in first["rows"])
    assert profile_trees(lean, taus, "sha256:" + "ab" * 32, context=32) == first  # read back, not measured again
    assert len(list((tmp_path / "profiles").iterdir())) == 1
    lean.native = None  # the PyTorch layers cost differently: their own profile
    profile_trees(lean, taus, "sha256:" + "ab" * 32, context=32)
    assert len(list((tmp_path / "profiles").iterdir())) == 2 - (native_kernels() is None)


def test_a_slow_spell_of_the_vm_moves_no_measured_size():
    """A shared VM's slow spell (here: 4 forwards in a row take 50 ms more) lands on one size alone when the sizes
    are measured one after another; taken in turns, every size's median drops it, so none looks dearer than it is."""
    model, _ = build_tiny_llama()
    lean = LeanLlama(model.float().eval(), 512)
    forward, calls = lean.forward, []

    def with_a_spell(*args, **kwargs):
        calls.append(None)
        if 9 <= len(calls) < 13:  # past the warming round, inside the measured ones
            time.sleep(0.05)
        return forward(*args, **kwargs)

    lean.forward = with_a_spell
    latency = measure_latencies(lean, [1, 2, 4, 8], context=32, rounds=5)
    assert sorted(latency) == [1, 2, 4, 8] and len(calls) == 4 * 6
    assert all(0 < seconds < 0.05 for seconds in latency.values()), latency


def test_a_drafters_own_time_counts_in_the_profile(monkeypatch, tmp_path):
    """Draft heads draft before the forward: a size whose draft is slow loses to one whose draft is fast."""
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    model, _ = build_tiny_llama()
    lean = LeanLlama(model.float().eval(), 512)
    taus = {4: 1.5, 8: 1.6}
    slow = {4: 0.0, 8: 10.0}  # seconds: far beyond any forward of the tiny model
    profile = profile_trees(lean, taus, "sha256:" + "cd" * 32, context=32, drafter="heads",
                            draft_seconds=slow.__getitem__)
    rows = {row["size"]: row for row in profile["rows"]}
    assert rows[8]["draft_ms"] == 10_000 and rows[8]["latency_ms"] > 10_000 and rows[4]["draft_ms"] == 0
    assert profile["chosen"] == 4


def test_kv_cache_rows_are_an_odd_number_of_cache_lines():
    """The native layers' cache is at least as wide as asked, whole 16-float lines (no vector load of a key row
    straddles two), and an odd number of them (the 64 transposed rows of a head's keys fall in different L1 sets)."""
    for capacity in (1, 15, 16, 17, 256, 289, 1024, 4096, 4097):
        width = cache_width(capacity)
        assert width >= capacity and width % 16 == 0 and (width // 16) % 2 == 1 and width - capacity < 32, capacity
    model, _ = build_tiny_llama()
    lean = LeanLlama(model.eval(), 256)
    if lean.native is not None:
        assert lean.new_cache(4096).capacity == 4112 and lean.new_cache(4096).k.shape[-1] == 4112



@pytest.mark.parametrize("path", ["native", "native-q4", "pytorch"])
def test_ppd_reads_a_long_prompt_into_the_cache_bit_for_bit_as_ar_does(path, monkeypatch):
    """A prompt longer than the rows the kernels hold row-invariant (fixed_shapes.ROWS): PPD's read of it leaves the
    cache and the first logits exactly `ar`'s, the prompt tokens' rows dropped. Read in one step with the prompt
    tokens behind it, SmolLM2's cache took other bits on Q4_1 blocks and in bfloat16, and a greedy answer parted from
    ar's (MT-Bench's tenth first turn)."""
    from conftest import plain_tiny_decoder

    from ppdkit.runtime.drafters.ar import PlainDrafter
    from ppdkit.runtime.drafters.ppd import read_with_prompt_tokens
    from ppdkit.runtime.forward.fixed_shapes import ROWS

    decoder = plain_tiny_decoder(path, monkeypatch)
    model = decoder.model
    prompts = PromptTokenSet(torch.randn(6, model.embed_ids(torch.tensor([1])).shape[-1], generator=torch.Generator().manual_seed(1)), None, 3,
                             2, "ensemble")
    ids = torch.randint(3, model.vocab_size, (ROWS + 37,), generator=torch.Generator().manual_seed(2))
    plain = PlainDrafter(decoder, model.new_cache(len(ids) + 16))
    logits = plain.prefill(ids)
    cache = model.new_cache(len(ids) + 16)
    mine, guesses = read_with_prompt_tokens(model, cache, ids, prompts, 4)
    assert torch.equal(mine, logits) and cache.length == plain.cache.length == len(ids) and guesses.shape == (3, 4)
    assert torch.equal(cache.k[..., :len(ids)], plain.cache.k[..., :len(ids)])
    assert torch.equal(cache.v[:, :, :len(ids)], plain.cache.v[:, :, :len(ids)])
