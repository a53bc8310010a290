"""The 4-bit format's weights and arithmetic: SmolLM2's GGUF blocks read exactly (equal to the gguf package's
dequantization and to the converted model's weights), the PyTorch twin of the kernels' block arithmetic, and the
native AVX512-VNNI kernel equal to the twin bit for bit, for 1 to 80 rows."""

import logging

import numpy as np
import pytest
import torch
from conftest import kernels_or_skip

from ppdkit.models.loading import load_base_model
from ppdkit.models.smollm2 import GGUF_FILE, gguf_dir
from ppdkit.runtime.forward.gguf_blocks import (QuantizedWeight, _blocks, quantize_q4_1, quantize_q8_0,
                                                read_quantized_weights, unpermute_rotary_rows)
from ppdkit.runtime.kernels.twin import q8_rows, quantized_linear_twin


@pytest.fixture(scope="module")
def gguf_tensors():
    from gguf import GGUFReader

    return {t.name: t for t in GGUFReader(str(gguf_dir() / GGUF_FILE)).tensors}


@pytest.mark.parametrize("name", ["blk.0.ffn_down.weight", "blk.29.attn_q.weight", "token_embd.weight"])
def test_blocks_dequantize_as_the_gguf_package_does(gguf_tensors, name):
    from gguf.quants import dequantize

    tensor = gguf_tensors[name]
    weight = _blocks(tensor.tensor_type.name, np.asarray(tensor.data))
    assert weight.kind == ("Q8_0" if name == "token_embd.weight" else "Q4_1")
    assert torch.equal(weight.dequantize(), torch.from_numpy(dequantize(tensor.data, tensor.tensor_type)))
    if weight.kind == "Q4_1":
        assert weight.codes.dtype == torch.uint8 and int(weight.codes.max()) <= 15


def test_every_quantized_weight_is_the_converted_models_weight_bit_for_bit():
    """Names mapped and the query/key rows put back in Hugging Face's order: the 4-bit format decodes with exactly
    the weights the float32 model was converted from."""
    model = load_base_model("smollm2-135m").model
    cfg, state = model.config, model.state_dict()
    weights = read_quantized_weights(gguf_dir() / GGUF_FILE, cfg.num_attention_heads, cfg.num_key_value_heads)
    assert len(weights) == 7 * cfg.num_hidden_layers + 1
    mismatched = [name for name, w in weights.items() if not torch.equal(w.dequantize(), state[name])]
    assert mismatched == []


def test_the_rotary_row_order_is_a_permutation_of_whole_heads():
    index = unpermute_rotary_rows(3 * 64, 3)
    assert sorted(index.tolist()) == list(range(192))
    assert all(set(index[h * 64:(h + 1) * 64].tolist()) == set(range(h * 64, (h + 1) * 64)) for h in range(3))
    assert index[:4].tolist() == [0, 2, 4, 6] and index[32:34].tolist() == [1, 3]


def _random_q4_1(n: int, k: int, g: torch.Generator) -> QuantizedWeight:
    return QuantizedWeight("Q4_1", (torch.rand(n, k // 32, generator=g) * 0.02).half().float(),  # float16, as stored
                           torch.randint(0, 16, (n, k // 32, 32), generator=g, dtype=torch.uint8),
                           ((torch.rand(n, k // 32, generator=g) - 0.5) * 0.2).half().float())


def test_activation_blocks_keep_their_largest_value_and_zero_blocks_stay_zero():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=g)
    x[2, 32:64] = 0.0
    codes, scale, scaled_sum = q8_rows(x)
    assert codes.abs().amax(-1)[0].tolist() == [127, 127, 127] and int(codes.abs().max()) == 127
    assert scale[2, 1] == 0 and not codes[2, 1].any() and scaled_sum[2, 1] == 0
    back = (scale[..., None] * codes.float()).reshape(5, 96)
    assert ((back - x).abs() <= scale.repeat_interleave(32, dim=1) / 2 + 1e-7).all()  # round to nearest
    assert torch.equal(scaled_sum, scale * codes.sum(-1).float())


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_the_twin_is_the_product_of_the_dequantized_operands(kind):
    """Integer block sums, scales and minimums put together: the float64 product of the dequantized activations and
    weights, to float32 rounding; and a row's result is the same whatever rows are beside it."""
    g = torch.Generator().manual_seed(1)
    weight = _random_q4_1(40, 128, g)
    if kind == "Q8_0":
        weight = QuantizedWeight("Q8_0", weight.scale, torch.randint(-127, 128, (40, 4, 32), generator=g,
                                                                     dtype=torch.int8), None)
    x = torch.randn(7, 128, generator=g)
    codes, scale, _ = q8_rows(x)
    exact = (scale[..., None] * codes.float()).reshape(7, 128).double() @ weight.dequantize().double().T
    y = quantized_linear_twin(x, weight)
    assert torch.allclose(y.double(), exact, rtol=1e-5, atol=1e-5 * exact.abs().max().item())
    for rows in ([3], [6, 0], [1, 2, 4]):
        assert torch.equal(quantized_linear_twin(x[rows], weight), y[rows])


def _vnni_kernels():
    module = kernels_or_skip("native")
    if not module.quantized_available():
        pytest.skip("this CPU has no AVX512-VNNI: the 4-bit format's kernel is not built here")
    return module


def _random_q8_0(n: int, k: int, g: torch.Generator) -> QuantizedWeight:
    return QuantizedWeight("Q8_0", (torch.rand(n, k // 32, generator=g) * 0.02).half().float(),
                           torch.randint(-128, 128, (n, k // 32, 32), generator=g, dtype=torch.int8), None)


def test_panels_keep_the_blocks_float16_scales_and_refuse_others():
    """A panel block holds 16 outputs' codes, then their scales (and Q4_1's minimums) in float16, as the GGUF does:
    exact for every block a GGUF or the quantizers give; a scale float16 cannot hold is refused, not rounded."""
    module = _vnni_kernels()
    g = torch.Generator().manual_seed(2)
    q4, q8 = _random_q4_1(16, 64, g), _random_q8_0(16, 64, g)
    assert _packed(module, q4).shape == (1, 2, 256 + 2 * 16 * 2) and _packed(module, q8).shape == (1, 2, 512 + 16 * 2)
    unheld = QuantizedWeight("Q4_1", q4.scale * (1 + 2 ** -20), q4.codes, q4.minimum)
    with pytest.raises(RuntimeError, match="must be float16 values"):
        _packed(module, unheld)


def _packed(module, weight: QuantizedWeight):
    return module.quantized_pack(weight.codes, weight.scale,
                                 weight.minimum if weight.minimum is not None else torch.empty(0))


@pytest.mark.parametrize("make", [_random_q4_1, _random_q8_0], ids=["Q4_1", "Q8_0"])
def test_the_vnni_kernel_equals_its_twin_for_1_to_80_rows(make):
    """Bit for bit the twin's arithmetic, and every row its one-row result whatever the rows in the call (panels
    padded where N is not a multiple of 16, passes of up to 12 rows balanced)."""
    module = _vnni_kernels()
    g = torch.Generator().manual_seed(2)
    for n, k in ((40, 128), (192, 576), (7, 32)):
        weight = make(n, k, g)
        packed = _packed(module, weight)
        x = torch.randn(80, k, generator=g)
        x[3, :32] = 0.0  # a block of zeros: scale 0
        twin = quantized_linear_twin(x, weight)
        assert torch.equal(module.quantized_linear(x, packed, n), twin), (n, k)
        for rows in (1, 2, 11, 12, 13, 25, 64, 79):
            assert torch.equal(module.quantized_linear(x[:rows], packed, n), twin[:rows]), (n, k, rows)


@pytest.mark.parametrize("make", [_random_q4_1, _random_q8_0], ids=["Q4_1", "Q8_0"])
def test_the_amx_int8_tiles_give_the_vnni_kernels_bits(make):
    """Where the CPU has AMX-INT8, many rows go through its tiles: the same exact integer sums as VPDPBUSD, then the
    same float32 steps, so every row equals the VNNI path's (and the twin's) for 1 to 80 rows, on either path."""
    module = _vnni_kernels()
    if not module.quantized_amx_available():
        pytest.skip("this CPU has no AMX-INT8 tiles")
    g = torch.Generator().manual_seed(5)
    for n, k in ((40, 128), (192, 576), (7, 32)):
        weight = make(n, k, g)
        packed = _packed(module, weight)
        x = torch.randn(80, k, generator=g)
        x[20, 32:64] = 0.0
        vnni = module.quantized_linear(x, packed, n, amx_from_rows=10 ** 6)
        assert torch.equal(vnni, quantized_linear_twin(x, weight)), (n, k)
        for rows in (1, 2, 15, 16, 17, 24, 25, 33, 80):  # balanced tiles: 24 as 12 + 12, 25 as 13 + 12 and a zero row
            assert torch.equal(module.quantized_linear(x[:rows], packed, n, amx_from_rows=1), vnni[:rows]), (n, rows)
    default = module.quantized_amx_from_rows()  # the tiles from this many rows in a call that names none
    assert default == 16
    try:
        module.quantized_amx_from_rows(1)
        assert module.quantized_amx_from_rows() == 1 and torch.equal(module.quantized_linear(x[:3], packed, n),
                                                                     vnni[:3])
    finally:
        module.quantized_amx_from_rows(default)


def test_the_vnni_kernel_on_smollm2s_own_blocks(gguf_tensors):
    module = _vnni_kernels()
    g = torch.Generator().manual_seed(3)
    for name in ("blk.3.ffn_down.weight", "blk.3.attn_k.weight"):
        tensor = gguf_tensors[name]
        weight = _blocks(tensor.tensor_type.name, np.asarray(tensor.data))
        x = torch.randn(5, weight.shape[1], generator=g)
        assert torch.equal(module.quantized_linear(x, _packed(module, weight), weight.shape[0]),
                           quantized_linear_twin(x, weight)), name


def test_smollm2_decodes_on_its_own_blocks_losslessly():
    """`dtype="gguf"`: the lean runtime on the GGUF's blocks (every matmul on the 4-bit kernel, the tied head on the
    Q8_0 embedding): drafters that verify several rows per step give exactly the tokens of plain decoding on the
    same weights."""
    _vnni_kernels()
    from transformers import LlamaForCausalLM

    from ppdkit.bench.decoding import load_prompts
    from ppdkit.runtime.decoder import Decoder

    decoder = Decoder.from_base("smollm2-135m", dtype="gguf")
    assert decoder.model.weight_format == "gguf" and decoder.model.native is not None
    assert decoder.model.layers[0].qkv.weight is None  # no float copy of the matmuls' weights
    assert decoder._hf_model is None  # transformers' float32 copy released: nothing of the runtime reads it
    for prompt in load_prompts("mt-bench", 4) + load_prompts("humaneval", 2):
        plain = decoder.generate(prompt, max_new_tokens=48, method="ar").tokens
        for method in ("anpd", "self-draft"):
            assert decoder.generate(prompt, max_new_tokens=48, method=method).tokens == plain, (method, prompt[:40])
    assert isinstance(decoder.hf_model, LlamaForCausalLM)  # loaded again for a baseline that asks


def test_gguf_needs_the_base_models_own_file_and_the_int8_units(monkeypatch, caplog):
    from ppdkit.runtime.forward import precision
    from ppdkit.runtime.decoder import Decoder

    if precision.gguf_kernels_here():
        with pytest.raises(ValueError, match="dtype gguf multiplies the base model's own GGUF blocks: base model "
                                             "'tiny-llama' has no GGUF file"):
            Decoder.from_base("tiny-llama", dtype="gguf")
    monkeypatch.setattr(precision, "gguf_kernels_here", lambda: False)  # a CPU without AVX512-VNNI
    assert precision.resolve_dtype("gguf") == precision.resolve_dtype("auto")
    assert "gguf weights need the native AVX512-VNNI kernels" in caplog.text


def test_auto_picks_gguf_where_the_base_model_has_one_and_the_cpu_its_int8_units(monkeypatch, caplog):
    """auto is the fastest lossless format here: SmolLM2's own blocks on a CPU with AVX512-VNNI; for a base model
    without a GGUF, a CPU without the int8 units, a GPU or a caller on transformers' model (no base), a float."""
    from ppdkit.runtime.forward import precision

    floats = precision.resolve_dtype("auto")
    assert floats in ("bfloat16", "float32")  # the teacher's auto: transformers computes on floats
    assert precision.resolve_dtype("auto", base_name="tiny-llama") == floats
    assert precision.resolve_dtype("auto", "cuda", "smollm2-135m") == "bfloat16"
    assert precision.resolve_dtype("float32", base_name="smollm2-135m") == "float32"  # asked for: kept
    monkeypatch.setattr(precision, "gguf_kernels_here", lambda: True)
    with caplog.at_level(logging.INFO, logger="ppdkit.runtime.forward.precision"):
        assert precision.resolve_dtype("auto", base_name="smollm2-135m") == "gguf"
    assert "dtype auto: gguf (smollm2-135m's own GGUF blocks" in caplog.text
    monkeypatch.setattr(precision, "gguf_kernels_here", lambda: False)  # a CPU without AVX512-VNNI
    assert precision.resolve_dtype("auto", base_name="smollm2-135m") == floats


def test_the_q4_format_quantizes_as_llama_cpps_reference_quantizer():
    """q4's blocks (for base models without a GGUF) are those the gguf package's quantizer makes, bit for bit."""
    from gguf.quants import GGMLQuantizationType, dequantize, quantize

    g = torch.Generator().manual_seed(4)
    weight = torch.randn(48, 256, generator=g)
    weight[0, :32] = 0.0  # a constant block: scale 0
    for kind, ours in ((GGMLQuantizationType.Q4_1, quantize_q4_1), (GGMLQuantizationType.Q8_0, quantize_q8_0)):
        theirs = torch.from_numpy(dequantize(quantize(weight.numpy(), kind), kind))
        assert torch.equal(ours(weight).dequantize(), theirs), kind.name
    with pytest.raises(ValueError, match="needs every matmul's input width to be a multiple of 32"):
        quantize_q4_1(torch.randn(4, 40))
