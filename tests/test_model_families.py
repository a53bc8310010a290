"""Base models users bring (ppdkit/models/tiny.py's tiny random Llama 3 with llama3 rope scaling, Qwen2 with query/key/value
biases and an untied head, Mistral with a sliding window), each a local HF directory: the lean runtime's logits are
transformers' on both kernel paths, decoding is transformers' greedy, `ppdkit run` trains, calibrates and registers
a component for each, and an architecture outside the family is refused, naming what is supported."""

import json

import pytest
import torch
from conftest import assert_gives_hf_greedy, kernels_or_skip
from test_pipeline import spec_file  # noqa: F401 (the tiny job's spec, a fixture)

import ppdkit.runtime.forward.linear as linear_module
from ppdkit.cli.main import main
from ppdkit.models.loading import load_base_model
from ppdkit.models.tiny import build_tiny_tokenizer, write_tiny_family
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.forward.llama import LeanLlama

FAMILIES = ("llama3", "qwen2", "mistral")


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    for family in FAMILIES:
        write_tiny_family(root / family, family)
    return {family: root / family for family in FAMILIES}


@pytest.mark.parametrize("path", ["native", "pytorch"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_lean_runtime_gives_transformers_logits(family, path, family_dirs, monkeypatch):
    module = kernels_or_skip("native") if path == "native" else None
    monkeypatch.setattr(linear_module, "native_kernels", lambda: module)
    model = load_base_model(str(family_dirs[family])).model
    lean = LeanLlama(model)
    # the native whole-step layers have no biases: Qwen2 runs its steps on the PyTorch layers
    assert (lean.native is not None) == (path == "native" and family != "qwen2")
    ids = torch.randint(3, 300, (30,), generator=torch.Generator().manual_seed(0))
    cache = lean.new_cache(64)
    with torch.no_grad():
        prefill = lean.forward(lean.embed_ids(ids[:25]), torch.arange(25), cache, None)
        cache.commit(None, 25)
        step = lean.forward(lean.embed_ids(ids[25:]), torch.arange(25, 30), cache, None)  # a few-rows step
        ours = lean.logits(torch.cat([prefill, step]))
        torch.testing.assert_close(ours, model(ids[None]).logits[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_component_free_method_is_transformers_greedy(family, family_dirs):
    decoder = Decoder.from_base(str(family_dirs[family]), dtype="float32")  # transformers' float32 tokens
    model = decoder.hf_model
    if family == "mistral":
        assert decoder.max_length == model.config.sliding_window  # the window caps the context
    for case, ids in enumerate(([5, 6, 7], [9, 3, 9, 3, 9, 3, 9], list(range(40, 70)))):
        for method in ("ar", "anpd", "self-draft"):
            assert_gives_hf_greedy(decoder, model, method, ids, 24, (family, method, case))


@pytest.mark.parametrize("family", FAMILIES)
def test_ppdkit_run_trains_and_registers_a_component_for_each_family(family, family_dirs, ray_local, tracking_uri,
                                                                     spec_file, tmp_path):
    out = tmp_path / "out"
    assert main(["run", str(spec_file), "--output", str(out), f"base_model.name={family_dirs[family]}",
                 "evaluate.limit=1"]) == 0
    bench = json.loads((out / "evaluate" / "bench.json").read_text())
    assert all(r["identical_to_greedy"] == 1.0 for r in bench["results"])
    registered = json.loads((out / "register" / "summary.json").read_text())
    decoder = Decoder.from_pretrained(registered["uri"])
    for ids in ([5, 6, 7, 8], [9, 3, 9, 3, 9, 3]):
        assert decoder.generate(ids, max_new_tokens=12, method="ppd").tokens == decoder.generate(ids,
                                max_new_tokens=12, method="ar").tokens


def test_other_architectures_are_refused_naming_the_supported_ones(tmp_path, spec_file, tracking_uri, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = build_tiny_tokenizer()
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="type 'gpt2' are not supported: ppdkit runs the Llama family"):
        Decoder.from_base(str(tmp_path))
    assert main(["run", str(spec_file), "--output", str(tmp_path / "out"), f"base_model.name={tmp_path}"]) != 0
    assert "Llama 2/3, Mistral, Qwen2/2.5" in capsys.readouterr().err


def _hub_cache_with(root, repo_id: str, model_dir) -> None:
    """A Hugging Face Hub cache holding `repo_id` as the Hub's own downloads lay it out (refs/main -> a snapshot),
    as `hf download` would have left it on a machine that reached the Hub."""
    import shutil

    revision = "0" * 40
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    shutil.copytree(model_dir, repo / "snapshots" / revision)


def test_a_hub_id_loads_from_the_hub_and_says_what_to_do_when_it_cannot(family_dirs, tmp_path):
    """No hub is reachable here: HF_HUB_OFFLINE makes huggingface_hub answer from its cache, which is what a
    download leaves; an id it does not hold is refused with what to do."""
    import os
    import subprocess
    import sys

    _hub_cache_with(tmp_path / "hub", "ppdkit-tests/tiny-llama3", family_dirs["llama3"])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    run = [sys.executable, "-m", "ppdkit.cli.main", "decode", "--method", "ar", "--prompt", "hi", "--max-new-tokens", "4"]
    found = subprocess.run(run + ["--base", "ppdkit-tests/tiny-llama3"], capture_output=True, text=True, env=env,
                           timeout=300)
    assert found.returncode == 0 and "[ar] 4 tokens" in found.stderr, found.stderr[-2000:]
    missing = subprocess.run(run + ["--base", "ppdkit-tests/not-there"], capture_output=True, text=True, env=env,
                             timeout=300)
    assert missing.returncode == 2, missing.stderr[-2000:]
    assert "the Hugging Face Hub could not provide it" in missing.stderr and "hf download" in missing.stderr
