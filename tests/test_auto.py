"""auto (ppdkit/runtime/auto.py): the fastest method a decoder serves, from a short measured trial cached per machine,
never a drafter that does not beat ar there; its output is the base model's like every method's."""

import pytest
from test_draft_heads import VOCAB, _decoder, _heads

import ppdkit.runtime.auto as auto_module
from ppdkit.models.tiny import build_tiny_llama
from ppdkit.runtime.auto import choose


def test_a_drafter_must_beat_ar_by_the_margin():
    assert choose({"ar": 100.0, "anpd": 120.0, "feature-grown": 110.0}) == "anpd"
    assert choose({"ar": 100.0, "anpd": 102.0}) == "ar"  # within the trial's noise: plain decoding
    assert choose({"ar": 100.0, "anpd": 90.0}) == "ar"


def test_auto_measures_once_per_machine_then_decodes_like_ar(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    model, tok = build_tiny_llama()
    model = model.float().eval()
    heads = _heads("feature", 3, torch.Generator().manual_seed(0), model, torch.arange(VOCAB))
    measured = []
    real = auto_module.measure

    def counted(decoder, methods, *args, **kwargs):
        measured.append(methods)
        return real(decoder, methods, ("one two three one two three", "def f(x): return x"), 12)

    monkeypatch.setattr(auto_module, "measure", counted)
    # the cached choice is what this test holds; a trial that the live steps find stale (a busy machine's, when the
    # load beside the test eases: trees/profile_check.py) is measured again, which test_profile_check holds
    monkeypatch.setattr("ppdkit.runtime.trees.profile_check.FASTER", float("inf"))
    decoder = _decoder(model, tok, heads, None)
    ids = [5, 17, 42, 5, 17, 42, 5]
    out = decoder.generate(ids, max_new_tokens=20, method="auto")
    assert measured == [["ar", "anpd", "self-draft", "feature-grown", "feature-grown-anpd"]]
    assert out.method in measured[0] and out.tokens == decoder.generate(ids, max_new_tokens=20, method="ar").tokens
    again = _decoder(model, tok, heads, None)  # another process on this machine: the cached choice
    assert again.generate(ids, max_new_tokens=20, method="auto").method == out.method and len(measured) == 1
    saved = next((tmp_path / "profiles").glob("auto-*.json")).read_text()
    assert '"chosen": "%s"' % out.method in saved and "tokens_per_s" in saved
    with pytest.raises(ValueError, match="needs"):
        decoder.generate(ids, max_new_tokens=4,
                         method="ppd")  # auto does not lend other methods what the component lacks


def test_ppdkit_decode_runs_auto_unless_told(tmp_path, monkeypatch, capsys):
    """A newcomer's first decode names no method: it gets the fastest this decoder serves here, never a method the
    component lacks, and the last line says which ran."""
    from ppdkit.cli.main import main

    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    assert main(["decode", "--base", "tiny-llama", "--prompt", "Hello", "--max-new-tokens", "6"]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("[auto] (auto ran "), last


def test_a_method_the_component_lacks_fails_before_the_model_loads(tmp_path, capsys):
    """An EAGLE-3 component asked for `ppd`: refused from its component.json (the error names what it serves), with
    no model loaded; what it does carry, and what an early head or the corpus add at load, pass the check."""
    import time

    from ppdkit.cli.decode_commands import refuse_unserved_method
    from ppdkit.cli.main import main

    eagle3 = "ppdkit/models/components/smollm2-135m-eagle3"
    started = time.monotonic()
    assert main(["decode", "--model", eagle3, "--method", "ppd", "--prompt", "Hello"]) == 2
    err = capsys.readouterr().err
    assert "needs prompt tokens and calibrated trees" in err and "eagle3-corpus" in err and time.monotonic() - started < 10, err
    for method in ("eagle3", "eagle3-corpus", "ar", "auto"):
        refuse_unserved_method(eagle3, method)
    refuse_unserved_method("ppdkit/models/components/smollm2-135m-ppd", "ppd-prune")  # its early head: at load
    with pytest.raises(ValueError, match="a custom decoding head"):
        refuse_unserved_method("ppdkit/models/components/smollm2-135m-ppd", "ppd-head")


def test_the_trials_second_half_times_only_ar_and_the_close_ones():
    from ppdkit.runtime.auto import KEEP, still_in

    speeds = {"ar": 100.0, "anpd": 90.0, "self-draft": 60.0, "eagle3": 150.0, "eagle3-anpd": 150 * KEEP}
    assert still_in(list(speeds), speeds) == ["ar", "eagle3", "eagle3-anpd"]
    assert still_in(["ar", "anpd"], {"ar": 100.0, "anpd": 50.0}) == ["ar"]
