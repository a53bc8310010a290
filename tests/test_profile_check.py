"""Cached timings held to the live steps (runtime/trees/profile_check.py): a latency profile or auto's trial measured on
a busier machine is measured again once the decoder's own steps prove it too slow; one measured quiet is never
replaced by a busy machine's slowness."""

import json
import logging

from conftest import write_tiny_ppd_component
from test_draft_heads import VOCAB, _decoder, _heads

import ppdkit.runtime.auto as auto_module
from ppdkit.models.tiny import build_tiny_llama
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.trees.profile_check import FASTER, MIN_STEPS, RECENT_STEPS, StepCheck

PROMPTS = ([5, 17, 42, 5, 17, 42, 5], [9, 8, 7, 6], [3, 4, 3, 4, 3, 4, 3, 4])


def _priced(path, ms: float) -> dict:
    """The cached profile at `path` with every forward priced at `ms`, written back: far above any step of the tiny
    model (a busier machine's), or far below (a machine the live steps can never match, busy or not)."""
    profile = json.loads(path.read_text())
    profile["one_token_ms"] = ms
    for row in profile["rows"]:
        row["latency_ms"], row["draft_ms"] = ms, 0.0
    path.write_text(json.dumps(profile))
    return profile


def _decode_enough_steps(decoder, method: str) -> int:
    steps = 0
    while steps < MIN_STEPS:
        for ids in PROMPTS:
            steps += len(decoder.generate(ids, max_new_tokens=12, method=method).step_seconds)
    return steps


def test_the_check_prices_steps_between_the_measured_rows_and_judges_the_median():
    check = StepCheck([1, 4, 8], [0.010, 0.013, 0.021])
    assert abs(check.predicted(2) - 0.011) < 1e-12 and check.predicted(16) == 0.021
    for _ in range(MIN_STEPS - 1):
        check.observe(4, 0.013 / (FASTER + 0.5))
    assert not check.stale()  # too few steps to judge
    check.observe(1, 0.5)  # one slow step moves no median
    assert check.stale() and abs(check.median() * (FASTER + 0.5) - 1) < 1e-9
    for _ in range(RECENT_STEPS):
        check.observe(4, 0.013)  # the latest steps are what is judged: the figure holds again
    assert not check.stale() and len(check.ratios) == RECENT_STEPS
    slow = StepCheck([1], [0.010])
    for _ in range(4 * MIN_STEPS):
        slow.observe(1, 0.100)  # a busy machine now: it proves nothing about the figure
    assert not slow.stale()


def test_a_profile_cached_by_a_busy_machine_is_measured_again_from_the_live_steps(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    component = write_tiny_ppd_component(tmp_path / "component")
    Decoder.from_pretrained(component)  # measured here, cached
    cached = next((tmp_path / "profiles").glob("*-ppd-*.json"))
    poisoned = _priced(cached, 5000.0)  # as if a test suite and a compile had run beside the measurement
    decoder = Decoder.from_pretrained(component)
    assert decoder.profile["one_token_ms"] == poisoned["one_token_ms"]  # read from the cache, as any load does
    with caplog.at_level(logging.WARNING, logger="ppdkit.runtime.decoder"):
        _decode_enough_steps(decoder, "ppd")
    assert "measured on a busier machine" in caplog.text
    assert decoder.profile["one_token_ms"] < 500  # measured again, in use
    assert json.loads(cached.read_text())["one_token_ms"] == decoder.profile["one_token_ms"]  # and cached


def test_a_busy_machine_does_not_replace_a_quiet_profile(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    component = write_tiny_ppd_component(tmp_path / "component")
    Decoder.from_pretrained(component)
    cached = next((tmp_path / "profiles").glob("*-ppd-*.json"))
    fast = _priced(cached, 1e-4)  # the live steps run far slower than the cached figure
    decoder = Decoder.from_pretrained(component)
    with caplog.at_level(logging.WARNING, logger="ppdkit.runtime.decoder"):
        _decode_enough_steps(decoder, "ppd")
    assert "busier machine" not in caplog.text and json.loads(cached.read_text()) == fast == decoder.profile


def test_an_auto_trial_timed_on_a_busy_machine_is_timed_again(tmp_path, monkeypatch, caplog):
    import torch

    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    model, tok = build_tiny_llama()
    model = model.float().eval()
    heads = _heads("feature", 3, torch.Generator().manual_seed(0), model, torch.arange(VOCAB))
    trials, real = [], auto_module.measure

    def short(decoder, methods, *args, **kwargs):
        trials.append(methods)
        return real(decoder, methods, ("one two three one two three", "def f(x): return x"), 12)

    monkeypatch.setattr(auto_module, "measure", short)
    chosen = _decoder(model, tok, heads, None).fastest_method()
    path = next((tmp_path / "profiles").glob("auto-*.json"))
    trial = json.loads(path.read_text())
    assert set(trial["step_seconds"]) == set(trial["methods"]) and all(s > 0 for s in trial["step_seconds"].values())
    trial["step_seconds"] = {m: 5.0 for m in trial["step_seconds"]}  # timed beside other work
    path.write_text(json.dumps(trial))
    decoder = _decoder(model, tok, heads, None)
    with caplog.at_level(logging.WARNING, logger="ppdkit.runtime.decoder"):
        for ids in PROMPTS * MIN_STEPS:  # until the live steps judge the trial; not one auto decode after that
            decoder.generate(ids, max_new_tokens=12, method="auto")
            if not path.exists():
                break
    assert "auto's cached trial was timed on a busier machine" in caplog.text and len(trials) == 1
    assert not path.exists()  # dropped: the next auto decode times the methods again, here and in a new process
    assert decoder.generate(PROMPTS[0], max_new_tokens=4, method="auto").method == decoder.fastest_method()
    assert len(trials) == 2 and path.exists() and chosen in trials[1]


def test_trees_that_no_size_makes_pay_run_plain_steps_never_a_slowdown(tmp_path, monkeypatch, caplog):
    """A profile in which every calibrated size is predicted slower than one-token steps: `ppd` runs as `ar` (said
    once in the log, the same tokens); a tree size given by name still runs the trees; a paying profile runs them."""
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    component = write_tiny_ppd_component(tmp_path / "component")
    Decoder.from_pretrained(component)
    cached = next((tmp_path / "profiles").glob("*-ppd-*.json"))
    profile = json.loads(cached.read_text())
    for row in profile["rows"]:  # each size's step 4x a one-token step: no tau of these trees pays for that
        row["latency_ms"] = 4 * profile["one_token_ms"]
        row["speedup_vs_one_token"] = row["tau"] / 4
    cached.write_text(json.dumps(profile))
    decoder = Decoder.from_pretrained(component)
    assert decoder.unpaid and "predicted at best" in decoder.unpaid
    with caplog.at_level(logging.WARNING, logger="ppdkit.runtime.decoder"):
        out = [decoder.generate(ids, max_new_tokens=12, method="ppd") for ids in PROMPTS]
    assert {r.method for r in out} == {"ar"} and caplog.text.count("ppd runs as ar here") == 1
    assert [r.tokens for r in out] == [decoder.generate(ids, max_new_tokens=12, method="ar").tokens for ids in PROMPTS]
    assert Decoder.from_pretrained(component, tree_size=8).generate(PROMPTS[0], max_new_tokens=12,
                                                                     method="ppd").method == "ppd"
    cached.unlink()  # measured again: the tiny model's rows cost next to nothing, so its trees pay
    paying = Decoder.from_pretrained(component)
    assert paying.unpaid is None and paying.generate(PROMPTS[0], max_new_tokens=12, method="ppd").method == "ppd"
