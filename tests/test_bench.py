"""`ppdkit bench` (jobs/bench.py) on the tiny model: repeated runs count each method's fastest and must agree."""

import json

import pytest

import ppdkit.jobs.bench as bench


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("one two three one two", "def f(x): return x")))
    return str(path)


def test_repeats_count_each_methods_fastest_run(prompts, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    timed = []
    real = bench.run_method

    def recorded(decoder, method, ids, max_new_tokens):
        out = real(decoder, method, ids, max_new_tokens)
        timed.append(method)
        return out

    monkeypatch.setattr(bench, "run_method", recorded)
    report = bench.run_bench("tiny-llama", prompts, None, 12, ["ar", "anpd", "auto"], base_only=True, repeats=3)
    assert report["repeats"] == 3
    warmup = 4  # one short run per method before timing
    assert timed[warmup:] == ["hf-greedy", "ar", "anpd", "auto"] * 3 * 2  # in turns, every prompt 3 times
    assert [r["identical_to_greedy"] for r in report["results"]] == [1.0] * 4
    ran = report["results"][-1]["ran"]  # what auto's trial chose, said in the report and the table
    assert ran in ("ar", "anpd", "self-draft")
    bench.print_table(report)
    assert f"ran {ran} (the fastest in its trial" in capsys.readouterr().out
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        bench.run_bench("tiny-llama", prompts, None, 12, ["ar"], base_only=True, repeats=0)


def test_a_method_whose_repeats_disagree_is_reported(prompts, monkeypatch, tmp_path):
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    real, calls = bench.run_method, {"anpd": 0}

    def drifting(decoder, method, ids, max_new_tokens):
        tokens, *rest = real(decoder, method, ids, max_new_tokens)
        if method == "anpd":
            calls["anpd"] += 1
            if calls["anpd"] == 3:  # the first prompt's second timed run (after the warm-up) decodes otherwise
                tokens = tokens[:-1]
        return (tokens, *rest)

    monkeypatch.setattr(bench, "run_method", drifting)
    with pytest.raises(RuntimeError, match="anpd gave different tokens on two runs of prompt 0"):
        bench.run_bench("tiny-llama", prompts, None, 12, ["anpd"], base_only=True, repeats=2)
