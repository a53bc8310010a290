"""The runtime on any torch device (issue 15, item 2). Nothing here has a GPU, so two checks stand in for one:
- every tensor a decoder holds after loading any kind of component is on the device it was asked for: loaded
  on torch's `meta` device (shapes without data), nothing may be left on the CPU;
- decoding makes each tensor it needs on the decoder's device: with torch's default device set elsewhere
  (meta), a CPU decoder must still decode every method exactly as before, through the same `device` argument
  that `--device cuda` sets. A tensor made without the decoder's device would land on meta and fail or differ.
"""

import dataclasses
import random

import pytest
import torch
from conftest import kernels_or_skip

from ppdkit.data_pipeline.ngram_cache import build_ngram_table
from ppdkit.cli.main import main
from ppdkit.models.artifact import write_component, write_ngrams
from ppdkit.models.draft_heads import DraftHeads
from ppdkit.models.eagle3 import Eagle3Draft, aux_layers, expected_shapes
from ppdkit.models.loading import load_base_model
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.forward.devices import check_device
from ppdkit.runtime.trees.tree import best_tree_for_size, candidate_tree

HIDDEN, VOCAB, LAYERS = 64, 256, 2  # the tiny Llama's shapes


def _ppd(directory, fingerprint, g):
    """Prompt tokens with a custom decoding head, their trees and an n-gram table."""
    p = [[0.6, 0.2, 0.1], [0.4, 0.2, 0.1], [0.3, 0.1, 0.05]]
    write_component(directory, "ept-head", {"num_prompt_tokens": 3, "num_epts": 1, "mask": "ensemble"}, "tiny-llama",
                    fingerprint, {}, {"prompt_embeddings": torch.randn(3, 1, HIDDEN, generator=g),
                                      "head_weight": torch.randn(HIDDEN, HIDDEN, generator=g) / 8,
                                      "head_bias": torch.randn(HIDDEN, generator=g)},
                    extras={"trees": {"trees": {str(s): best_tree_for_size(p, s).to_json() for s in (6, 12)}}})
    write_ngrams(directory, build_ngram_table([[5, 6, 7, 8] * 3], max_n=2, branches=2, length=3).to_tensors())


def _heads(kind: str):
    def write(directory, fingerprint, g):
        depth = 3
        tensors = {name: t.detach() + 0.1 * torch.randn(t.shape, generator=g)
                   for name, t in zip(("feature_in", "feature_up", "feature_down") if kind == "feature"
                                      else ("medusa_weight", "medusa_bias"), DraftHeads(kind, HIDDEN, depth, 32, seed=1)())}
        table = [[0.5, 0.2, 0.1, 0.05]] * depth
        trees = {}
        for size in (5, 9):
            parents, depths, ranks, _ = candidate_tree(table, depth, size - 1)
            trees[str(size)] = {"parents": parents, "depths": depths, "ranks": ranks, "tau": 1.5}
        write_component(directory, f"{kind}-head" if kind == "feature" else "medusa",
                        {"head_kind": kind, "head_depth": depth}, "tiny-llama", fingerprint, {},
                        {**tensors, "draft_vocab": torch.randperm(VOCAB, generator=g)[:40]},
                        extras={"trees": {"trees": trees}})
    return write


def _skip_finetune(directory, fingerprint, g):
    write_component(directory, "skip-finetune", {"skip_map": [1, 2]}, "tiny-llama", fingerprint, {},
                    {"skip_ln1": 1 + 0.1 * torch.randn(LAYERS, HIDDEN, generator=g),
                     "skip_ln2": 1 + 0.1 * torch.randn(LAYERS, HIDDEN, generator=g),
                     "skip_norm": 1 + 0.1 * torch.randn(HIDDEN, generator=g),
                     "draft_vocab": torch.randperm(VOCAB, generator=g)[:64]})


def _early_head(directory, fingerprint, g):
    write_component(directory, "early-head", {"early_layer": 1}, "tiny-llama", fingerprint, {},
                    {"early_weight": torch.randn(HIDDEN, HIDDEN, generator=g) / 8,
                     "early_bias": torch.randn(HIDDEN, generator=g) / 8,
                     "draft_vocab": torch.randperm(VOCAB, generator=g)[:64]})


def _eagle3(directory, fingerprint, g):
    model = load_base_model("tiny-llama").model
    vocab = torch.randperm(VOCAB, generator=g)[:48]
    draft = Eagle3Draft(expected_shapes(model.config, len(vocab)), model.get_output_embeddings().weight.detach()[vocab], 0)
    write_component(directory, "eagle3", {"head_kind": "eagle3", "head_depth": 3,
                                          "aux_layers": list(aux_layers(model.config.num_hidden_layers))},
                    "tiny-llama", fingerprint, {}, {**{k: v.detach() for k, v in draft().items()}, "draft_vocab": vocab})


KINDS = {"ppd": _ppd, "feature": _heads("feature"), "medusa": _heads("medusa"), "skip-finetune": _skip_finetune,
         "eagle3": _eagle3}


@pytest.fixture(scope="module")
def components(tmp_path_factory):
    """One component of each kind for the tiny Llama (random weights), and an early head for the ppd one."""
    fingerprint, root, g = load_base_model("tiny-llama").fingerprint, tmp_path_factory.mktemp("c"), torch.Generator()
    g.manual_seed(0)
    for kind, write in {**KINDS, "early-head": _early_head}.items():
        write(root / kind, fingerprint, g)
    return root


def _load(components, kind: str, device: str, fixed_shapes: bool | None = None) -> Decoder:
    early = components / "early-head" if kind == "ppd" else None
    return Decoder.from_pretrained(components / kind, tree_size=9 if kind in ("feature", "medusa", "eagle3") else 12,
                                   dynamic_size=kind == "ppd", early_head=early, device=device,
                                   fixed_shapes=fixed_shapes)


def _tensors(obj, where: str, seen: set) -> list[tuple[str, torch.Tensor]]:
    """Every tensor reachable from `obj` through attributes, dataclass fields and containers, by path."""
    if id(obj) in seen or obj is None or isinstance(obj, (str, int, float, bool, torch.device, torch.dtype)):
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [(where, obj)]
    if isinstance(obj, torch.nn.Module):
        return [(f"{where}.{name}", t) for name, t in [*obj.named_parameters(), *obj.named_buffers()]]
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = enumerate(obj)
    elif dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__"):
        items = vars(obj).items()
    else:
        return []
    return [found for key, value in items for found in _tensors(value, f"{where}.{key}", seen)]


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_tensor_a_decoder_holds_is_on_its_device(components, kind):
    decoder = _load(components, kind, "meta")
    found = _tensors(decoder, "decoder", {id(decoder.tokenizer), id(decoder.draft.ngrams)})  # n-grams: Python tables
    elsewhere = [(path, t.device) for path, t in found if t.device.type != "meta"]
    assert len(found) > 20 and not elsewhere, elsewhere[:10]
    assert decoder.model.native is None  # the native kernels are CPU code
    assert decoder.model.fixed_rows is None  # meta decodes nothing; a GPU's steps have one shape (test below)


def _decode_everything(decoder: Decoder, prompts: list[list[int]]) -> dict:
    """Every method's tokens, greedy and sampled with a seed (a grown tree's size follows measured step times, which
    changes what its sampling draws: those methods are compared greedy only)."""
    return {(method, i, t): decoder.generate(ids, max_new_tokens=10, method=method, temperature=t,
                                             seed=7 if t else None).tokens
            for method in decoder.methods() if method != "auto"
            for i, ids in enumerate(prompts) for t in ((0.0,) if "grown" in method else (0.0, 0.8))}


@pytest.mark.parametrize("path", ["native", "pytorch", "pytorch-fixed"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_decoding_makes_its_tensors_on_the_decoders_device(components, kind, path, monkeypatch):
    """pytorch-fixed: the PyTorch layers in steps of one shape, as a GPU runs them
    (ppdkit/runtime/forward/fixed_shapes.py)."""
    import ppdkit.runtime.forward.linear as linear_module

    module = kernels_or_skip("native") if path == "native" else None
    monkeypatch.setattr(linear_module, "native_kernels", lambda: module)
    decoder = _load(components, kind, "cpu", fixed_shapes=path == "pytorch-fixed")
    decoder.draft.dynamic_size = False  # sizes picked from measured step times would change what sampling draws
    assert (decoder.model.native is not None) == (path == "native")
    assert (decoder.model.fixed_rows is not None) == (path == "pytorch-fixed")
    rng = random.Random(0)
    # two random prompts, each decoded by every method, greedy and sampled, on the CPU and then under meta (three
    # took 155 s of the suite on a 2-core AVX2 EPYC, most of it in the fixed-shape path's steps of 96 rows)
    prompts = [[rng.randrange(3, 30) for _ in range(rng.randint(2, 20))] for _ in range(2)]
    expected = _decode_everything(decoder, prompts)
    assert len({m for m, _, _ in expected}) >= 3
    torch.set_default_device("meta")
    try:
        found = _decode_everything(decoder, prompts)
    finally:
        torch.set_default_device(None)
    assert found == expected
    plain = {key: tokens for key, tokens in expected.items() if key[2] == 0.0}
    assert all(tokens == plain[("ar", i, 0.0)] for (_, i, _), tokens in plain.items())  # greedy: lossless


def test_a_device_this_machine_lacks_is_refused_clearly(capsys):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="torch sees no cuda device"):
            check_device("cuda")
        assert main(["decode", "--base", "tiny-llama", "--device", "cuda", "--prompt", "Hello"]) == 2
        assert "torch sees no cuda device on this machine" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not a torch device"):
        check_device("gpu0")
    assert check_device("cpu") == torch.device("cpu")
