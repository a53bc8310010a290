"""ANPD (Adaptive N-gram Parallel Decoding) as a decoding method of its own: the multi-level n-gram module by
hand, greedy output identical to plain greedy decoding on both kernel paths (against transformers in float64:
tests/test_lossless.py), sampled output with the base model's distribution, and decoding from a base model
with no component."""

import subprocess
import sys

import pytest
from conftest import lossless_on_random_prompts, plain_tiny_decoder
from test_sampling import first_two_tokens_follow_the_model, tiny_decoder  # noqa: F401  (the fixture)

from ppdkit.runtime.drafters.anpd import AdaptiveNgram
from ppdkit.runtime.decoder import Decoder


def test_the_longest_seen_context_guesses_its_most_frequent_follower():
    ngrams = AdaptiveNgram([1, 2, 3, 1, 2, 4, 9, 2, 4], max_n=3)
    assert ngrams.query([7, 2]) == 4  # (2,) was followed by 3 once and by 4 twice
    assert ngrams.query([1, 2]) == 4  # (1, 2): 3 then 4, a tie: the latest wins
    assert ngrams.query([9, 2]) == 4
    assert ngrams.query([5, 1]) == 2  # (5, 1) never seen: one level down, (1,)
    assert ngrams.query([5, 6]) is None
    ngrams.extend([1, 2, 3, 1, 2, 3])  # the text adapts: (1, 2) -> 3 is now the most frequent
    assert ngrams.query([1, 2]) == 3
    assert ngrams.draft(5) == [1, 2, 3, 1, 2]  # each guess read with the ones before it
    assert AdaptiveNgram([1, 2], max_n=5).draft(4) == []  # (2,) never followed by anything
    with pytest.raises(ValueError, match="max_n >= 2"):
        AdaptiveNgram([1], max_n=1)


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_anpd_gives_plain_greedy_tokens_on_both_kernel_paths(path, monkeypatch):
    decoder = plain_tiny_decoder(path, monkeypatch)
    steps = emitted = 0
    for plain, out in lossless_on_random_prompts(decoder, "anpd", 40):
        assert plain.rows_per_step == [1] * (plain.steps - 1) and len(out.rows_per_step) == out.steps - 1
        steps, emitted = steps + out.steps, emitted + len(out.tokens)
    assert emitted / steps > 1.5  # chains were accepted: multi-token verification and cache trimming ran


def test_sampled_anpd_draws_the_base_models_first_tokens(tiny_decoder):  # noqa: F811
    """The prompt repeats, so the first chain usually guesses the second token: it comes out of the chain's
    speculative acceptance."""
    first_two_tokens_follow_the_model(tiny_decoder, [5, 17, 5, 17, 5, 17, 5], "anpd")


def test_a_base_model_alone_decodes_with_anpd_and_refuses_component_methods(tmp_path):
    decoder = Decoder.from_base("tiny-llama")
    assert decoder.methods() == ["ar", "auto", "anpd", "self-draft"]
    with pytest.raises(ValueError, match="method ppd needs prompt tokens"):
        decoder.generate([5, 6, 7], max_new_tokens=4, method="ppd")
    out = subprocess.run([sys.executable, "-m", "ppdkit.cli.main", "decode", "--base", "tiny-llama", "--method",
                          "anpd", "--prompt", "hello hello hello", "--max-new-tokens", "12"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "[anpd] 12 tokens" in out.stderr and "inputs per step (at most 8)" in out.stderr  # root + a chain of 7
