"""`ppdkit export`: an eagle3 component in the layouts servers load (ppdkit/models/eagle3_export.py): the tensors and config
each layout names, the vocabulary maps, refusals of what cannot be exported, and the real consumer: the
`speculators` package (its own venv, `make setup-speculators`) loads the export, and its draft step equals
ppdkit's decoder's on random inputs."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_eagle3 import _draft_tensors

from ppdkit.cli.main import main
from ppdkit.models.artifact import ArtifactError, write_component
from ppdkit.models.eagle3 import aux_layers, readout
from ppdkit.models.eagle3_export import export_eagle3
from ppdkit.models.loading import load_base_model
from ppdkit.models.tiny import write_tiny_family
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.eagle3_drafter import draft_rows
from ppdkit.runtime.drafters.head_loading import eagle3_set

SPECULATORS_PYTHON = Path(__file__).parents[1] / ".venv-speculators" / "bin" / "python"
SPECULATORS_READY = SPECULATORS_PYTHON.parents[1] / ".ppdkit-setup"  # `make setup-speculators`: its import works
CONSUMER = Path(__file__).parent / "consumers" / "speculators_forward.py"


@pytest.fixture(scope="module")
def deep_base(tmp_path_factory) -> str:
    """A tiny Llama of 8 layers (a local directory): vLLM's and speculators' default hidden states 2, 4, 5 are
    distinct layers of it, as they are of any real model (tiny-llama's 2 layers cannot hold 3)."""
    out = tmp_path_factory.mktemp("deep") / "tiny-llama3-8-layers"
    write_tiny_family(out, "llama3", layers=8)
    return str(out)


def _component(directory: Path, base_name: str) -> Path:
    """An eagle3 component of `base_name` with random weights over a draft vocabulary of every third token."""
    base = load_base_model(base_name)
    vocab = torch.arange(0, base.model.config.vocab_size, 3)
    tensors = {"draft_vocab": vocab, **_draft_tensors(base.model, vocab, seed=4, scale=0.5)}
    layers = list(aux_layers(base.model.config.num_hidden_layers))
    hyper = {"head_kind": "eagle3", "aux_layers": layers, "head_depth": 2, "draft_vocab": len(vocab)}
    return write_component(directory, "eagle3", hyper, base_name, base.fingerprint, {}, tensors)


@pytest.fixture(scope="module")
def component(deep_base, tmp_path_factory) -> Path:
    return _component(tmp_path_factory.mktemp("eagle3") / "component", deep_base)


@pytest.mark.parametrize("fmt, layer", [("speculators", "layers.0."), ("sglang", "midlayer.")])
def test_each_layout_holds_every_tensor_and_the_vocabulary_maps(component, tmp_path, fmt, layer):
    assert main(["export", str(component), "--format", fmt, "--out", str(tmp_path / fmt)]) == 0
    tensors = load_file(str(tmp_path / fmt / "model.safetensors"))
    config = json.loads((tmp_path / fmt / "config.json").read_text())
    assert set(tensors) == {"embed_tokens.weight", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
                            *(layer + n for n in ("hidden_norm.weight", "input_layernorm.weight",
                                                  "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                                                  "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                                  "self_attn.o_proj.weight", "mlp.gate_proj.weight",
                                                  "mlp.up_proj.weight", "mlp.down_proj.weight"))}
    vocab = torch.arange(0, 384, 3)
    assert torch.equal(torch.arange(len(vocab)) + tensors["d2t"], vocab)  # target id = draft id + d2t[draft id]
    assert tensors["t2d"].dtype == torch.bool and torch.equal(tensors["t2d"].nonzero()[:, 0], vocab)
    assert tensors["fc.weight"].shape == (64, 192) and tensors["embed_tokens.weight"].shape == (384, 64)
    assert config["draft_vocab_size"] == 128 and config["norm_before_residual"] is False
    if fmt == "speculators":
        assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
        assert config["speculators_config"]["verifier"]["name_or_path"].endswith("tiny-llama3-8-layers")
    else:
        assert config["architectures"] == ["LlamaForCausalLMEagle3"]
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]


def test_what_cannot_be_exported_is_refused_and_nothing_is_written(component, tmp_path, capsys):
    base = load_base_model("tiny-llama")
    other = write_component(tmp_path / "feature", "feature-head", {"head_kind": "feature", "head_depth": 1},
                            "tiny-llama", base.fingerprint, {}, {"draft_vocab": torch.arange(4)})
    with pytest.raises(ArtifactError, match="is a feature-head component: only eagle3 drafts"):
        export_eagle3(other, tmp_path / "out", "speculators")
    assert main(["export", str(other), "--format", "sglang", "--out", str(tmp_path / "out")]) == 2
    assert "only eagle3 drafts have a sglang layout" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown export format 'onnx'"):
        export_eagle3(component, tmp_path / "out", "onnx")
    shallow = _component(tmp_path / "shallow", "tiny-llama")  # its hidden states 1, 1, 1: not three layers
    with pytest.raises(ArtifactError, match=r"distinct layers in 0 .. 1, and it reads \[1, 1, 1\]"):
        export_eagle3(shallow, tmp_path / "out", "sglang")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not SPECULATORS_READY.exists(), reason="the speculators venv is built by `make setup-speculators`")
def test_speculators_loads_the_export_and_its_draft_step_is_ppdkits(component, deep_base, tmp_path):
    out = export_eagle3(component, tmp_path / "draft", "speculators")  # the verifier: the base's own directory
    g = torch.Generator().manual_seed(0)
    t = 9
    inputs = {"aux": torch.randn(t, 192, generator=g), "ids": torch.randint(0, 384, (t,), generator=g),
              "positions": torch.arange(3, 3 + t)}
    save_file(inputs, str(tmp_path / "inputs.safetensors"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    done = subprocess.run([str(SPECULATORS_PYTHON), str(CONSUMER), str(out), str(tmp_path / "inputs.safetensors"),
                           str(tmp_path / "theirs.safetensors")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = load_file(str(tmp_path / "theirs.safetensors"))
    # ppdkit's decoder on the same inputs: the rows read into its draft cache at those positions, causal
    base = load_base_model(deep_base)
    decoder = Decoder(base.model, base.tokenizer)
    tensors = load_file(str(component / "weights.safetensors"))
    draft = eagle3_set({k: v for k, v in tensors.items() if k != "draft_vocab"}, tensors["draft_vocab"],
                       aux_layers(8), base.model)
    cache = draft.new_cache(32, torch.float32, torch.device("cpu"))
    # rows at positions 3 .. 11 of a cache whose first 3 rows are masked out: the rotary phases are absolute
    cache.commit(None, 3)
    visible = torch.ones(t, 3 + t, dtype=torch.bool).tril(diagonal=3)
    visible[:, :3] = False
    with torch.no_grad():
        h = draft_rows(decoder.model, draft, cache, draft.weights["fc.weight"](inputs["aux"]), inputs["ids"],
                       inputs["positions"], visible)
        logits = readout(h, draft.weights, draft.eps)
    assert torch.allclose(theirs["h"], h, atol=1e-5), (theirs["h"] - h).abs().max()
    assert torch.allclose(theirs["logits"], logits, atol=1e-5), (theirs["logits"] - logits).abs().max()
    assert torch.equal(theirs["d2t"] + torch.arange(128), tensors["draft_vocab"])  # their ids map to ours
