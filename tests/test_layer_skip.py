"""Draft & Verify's self-speculative decoding (D&V paper; ppdkit/runtime/drafters/layer_skip.py): a draft with nothing
skipped is the model itself and every draft token is accepted; random skip maps never change greedy output
on either kernel path or against transformers in float64; adaptive draft-exiting follows equations 2-4."""

import random
import subprocess
import sys

import pytest
from conftest import assert_gives_hf_greedy, plain_tiny_decoder

import ppdkit.runtime.drafters.layer_skip as layer_skip
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.draft_parts import LayerSkipParts
from ppdkit.runtime.drafters.layer_skip import DraftExit, check_skip_map

VOCAB = 384


def _random_map(rng: random.Random, layers: int) -> tuple[int, ...]:
    return tuple(rng.choice([0, 0, 1, 2, 3]) for _ in range(layers))


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_a_draft_that_skips_nothing_has_every_token_accepted(path, monkeypatch):
    decoder = plain_tiny_decoder(path, monkeypatch)
    monkeypatch.setattr(layer_skip, "DraftExit", lambda: DraftExit(gamma=0.0, epsilon=0.0))  # never exit early
    decoder.draft = LayerSkipParts(skip_map=(0,) * len(decoder.model.layers))
    ids = [5, 17, 42, 9]
    out = decoder.generate(ids, max_new_tokens=40, method="skip")
    assert out.tokens == decoder.generate(ids, max_new_tokens=40, method="ar").tokens
    assert out.accepted_per_step[1:-1] == [13] * (len(out.accepted_per_step) - 2)  # 12 drafted + 1, every stage


@pytest.mark.parametrize("path", ["native", "native-q4", "pytorch"])
def test_random_skip_maps_never_change_greedy_output(path, monkeypatch):
    decoder = plain_tiny_decoder(path, monkeypatch)
    rng = random.Random(0)
    for case in range(10):
        decoder.draft = LayerSkipParts(skip_map=_random_map(rng, len(decoder.model.layers)))
        gamma = rng.choice([0.0, 0.6, 1.0])  # long chains, the paper's start, one guess per stage
        monkeypatch.setattr(layer_skip, "DraftExit", lambda: DraftExit(gamma=gamma))
        ids = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 30))]
        assert decoder.generate(ids, max_new_tokens=30, method="skip").tokens == decoder.generate(ids,
                                max_new_tokens=30, method="ar").tokens, case


def test_random_skip_maps_reproduce_transformers_greedy_in_float64(tiny_f64, monkeypatch):
    model, tok = tiny_f64
    decoder = Decoder(model, tok)
    monkeypatch.setattr(layer_skip, "DraftExit", lambda: DraftExit(gamma=0.0))
    rng = random.Random(1)
    for case in range(20):
        decoder.draft = LayerSkipParts(skip_map=_random_map(rng, len(decoder.model.layers)))
        ids = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 40))]
        budget = rng.randint(1, 40)
        assert_gives_hf_greedy(decoder, model, "skip", ids, budget, case)


def test_adaptive_exit_follows_equations_2_to_4():
    rule = DraftExit(gamma=0.6, alpha=0.85, epsilon=0.01, beta1=0.5, beta2=0.9)
    acceptance, gamma = None, 0.6
    for stage in [1.0, 0.5, 0.0, 1.0, 1.0, 1.0, 0.25]:  # a scripted sequence of stage acceptance rates
        rule.update(stage)
        acceptance = stage if acceptance is None else 0.5 * acceptance + 0.5 * stage
        gamma = 0.9 * gamma + 0.1 * (gamma + 0.01 if acceptance <= 0.85 else gamma - 0.01)
        assert rule.acceptance == pytest.approx(acceptance) and rule.gamma == pytest.approx(gamma)
    assert rule.gamma > 0.6  # mostly low acceptance: the threshold rose


def test_skip_maps_are_checked():
    assert check_skip_map([0, 1, 2, 3], 4) == (0, 1, 2, 3)
    for bad in ([0, 1, 2], [0, 1, 2, 4], [-1, 0, 0, 0]):
        with pytest.raises(ValueError, match="one value per decoder layer"):
            check_skip_map(bad, 4)
    decoder = Decoder.from_base("tiny-llama")
    assert "skip" not in decoder.methods()
    with pytest.raises(ValueError, match="needs a layer-skip map .--base NAME --skip-map"):
        decoder.generate([5, 6], max_new_tokens=4, method="skip")
    assert "skip" in Decoder.from_base("tiny-llama", skip_map=(1,) * len(decoder.model.layers)).methods()


def test_decode_takes_a_skip_map_with_a_base_model(tmp_path):
    run = [sys.executable, "-m", "ppdkit.cli.main", "decode", "--base", "tiny-llama", "--method", "skip",
           "--prompt", "a b a b a b", "--max-new-tokens", "12"]
    out = subprocess.run(run + ["--skip-map", "0,3"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0 and "[skip] 12 tokens" in out.stderr, out.stderr
    out = subprocess.run(run + ["--skip-map", "0,3,1"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 2 and "one value per decoder layer (2)" in out.stderr.strip().splitlines()[-1]
