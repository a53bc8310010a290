import json

import pytest
import torch

from ppdkit.models.catalog import materialize
from ppdkit.models.fingerprint import cached_fingerprint, compute_fingerprint
from ppdkit.models.loading import keep_4bit_differentiable, load_base_model
from ppdkit.models.tiny import build_tiny_llama


def test_tiny_llama_is_deterministic():
    (m1, t1), (m2, t2) = build_tiny_llama(), build_tiny_llama()
    assert t1.get_vocab() == t2.get_vocab()
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert m1.config.num_hidden_layers == 2 and m1.config.hidden_size == 64
    assert m1.config.vocab_size == len(t1)


def test_unknown_base_model_names_the_choices():
    with pytest.raises(ValueError, match="smollm2-135m.*tiny-llama"):
        materialize("smollm3-9000")


def test_fingerprint_is_stable_and_sensitive(tiny_dir, tmp_path):
    fp = compute_fingerprint(tiny_dir)
    assert fp.startswith("sha256:") and fp == compute_fingerprint(tiny_dir) == cached_fingerprint(tiny_dir)
    # A copy with one weight nudged is another model.
    model, tokenizer = build_tiny_llama()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] += 1e-3
    model.save_pretrained(tmp_path)
    assert compute_fingerprint(tmp_path) != fp
    # So is a config change that alters the computation, even with identical weights.
    model, _ = build_tiny_llama()
    model.config.rope_theta = 1234.0
    model.save_pretrained(tmp_path / "rope")
    assert compute_fingerprint(tmp_path / "rope") != fp


def test_fp32_and_nf4_loads_share_the_fingerprint():
    plain = load_base_model("tiny-llama", quantization="none")
    nf4 = load_base_model("tiny-llama", quantization="nf4")
    assert plain.fingerprint == nf4.fingerprint
    assert not any(p.requires_grad for p in nf4.model.parameters())
    assert not any(p.requires_grad for p in plain.model.parameters())


def _dequantized_copy(nf4_model, plain_model):
    """A float model holding exactly the weights the 4-bit model computes with."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    ref = type(plain_model)(plain_model.config).eval()
    ref.load_state_dict(plain_model.state_dict())
    ref_modules = dict(ref.named_modules())
    for name, module in nf4_model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            w = F.dequantize_4bit(module.weight.data, module.weight.quant_state).float()
            ref_modules[name].weight.data.copy_(w)
    return ref.requires_grad_(False)


def test_gradients_reach_inputs_through_4bit_after_a_no_grad_forward():
    """The bitsandbytes CPU pitfall: an eval-mode no-grad forward repacks 4-bit weights for good."""
    base = load_base_model("tiny-llama", quantization="nf4", for_training=True)
    plain = load_base_model("tiny-llama", quantization="none")
    model = base.model
    ids = torch.tensor([[1, 40, 41, 42, 43, 44, 45, 2]])
    with torch.no_grad():  # what a teacher pass or an evaluation does before training
        model(ids)
    embeds = torch.nn.Parameter(model.get_input_embeddings()(ids).detach().clone())
    model(inputs_embeds=embeds).logits.float().pow(2).mean().backward()
    ref = _dequantized_copy(model, plain.model)
    ref_embeds = torch.nn.Parameter(embeds.detach().clone())
    ref(inputs_embeds=ref_embeds).logits.pow(2).mean().backward()
    cos = torch.nn.functional.cosine_similarity(embeds.grad.flatten(), ref_embeds.grad.flatten(), dim=0)
    assert embeds.grad.abs().sum() > 0
    assert cos > 0.999, f"gradient through the 4-bit model disagrees with the dequantized reference (cos {cos:.4f})"


def test_keep_4bit_differentiable_refuses_a_repacked_model():
    base = load_base_model("tiny-llama", quantization="nf4", for_training=False)
    with torch.no_grad():
        base.model(torch.tensor([[1, 40, 41]]))
    import bitsandbytes as bnb

    repacked = any(getattr(m.weight.quant_state, "packing_format_for_cpu", False)
                   for m in base.model.modules() if isinstance(m, bnb.nn.Linear4bit))
    if not repacked:
        pytest.skip("this CPU has no AVX512-BF16: bitsandbytes never repacks here")
    with pytest.raises(RuntimeError, match="for_training=True"):
        keep_4bit_differentiable(base.model)


def test_materialized_tiny_dir_is_a_plain_hf_directory(tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert list(tiny_dir.glob("*.safetensors"))
    assert (tiny_dir / "tokenizer.json").is_file()
