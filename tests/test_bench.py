"""`ppdkit bench` (ppdkit/bench/decoding.py, ppdkit/bench/plot.py) on the tiny model: repeated runs count each method's fastest
and must agree; a report says when, where and how it was made, and draws as a PNG."""

import json
import os
from datetime import datetime, timedelta, timezone

import pytest
import torch

import ppdkit.bench.decoding as bench


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("one two three one two", "def f(x): return x")))
    return str(path)


def test_repeats_count_each_methods_fastest_run(prompts, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    timed = []
    real = bench.run_method

    def recorded(decoder, method, ids, max_new_tokens, *runners):
        out = real(decoder, method, ids, max_new_tokens, *runners)
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

    def drifting(decoder, method, ids, max_new_tokens, *runners):
        tokens, *rest = real(decoder, method, ids, max_new_tokens, *runners)
        if method == "anpd":
            calls["anpd"] += 1
            if calls["anpd"] == 3:  # the first prompt's second timed run (after the warm-up) decodes otherwise
                tokens = tokens[:-1]
        return (tokens, *rest)

    monkeypatch.setattr(bench, "run_method", drifting)
    with pytest.raises(RuntimeError, match="anpd gave different tokens on two runs of prompt 0"):
        bench.run_bench("tiny-llama", prompts, None, 12, ["anpd"], base_only=True, repeats=2)


def test_in_bfloat16_ar_always_runs_as_what_outputs_must_equal(prompts, monkeypatch, tmp_path):
    """transformers' bfloat16 greedy rounds otherwise than ppdkit's runtime, so outside float32 a bench without `ar`
    in its methods runs it anyway: its methods are compared with it, not shown as 0.00 identical to hf-greedy."""
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    report = bench.run_bench("tiny-llama", prompts, None, 8, ["anpd"], base_only=True, dtype="bfloat16")
    if report["dtype"] != "bfloat16":
        pytest.skip("bfloat16 does not run on this CPU's kernels")
    assert [r["method"] for r in report["results"]] == ["hf-greedy", "ar", "anpd"]
    anpd = report["results"][-1]
    assert anpd["compared_with"] == "ar" and anpd["identical_to_greedy"] == 1.0


def test_a_report_says_when_where_and_how_it_was_made(prompts, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    report = bench.run_bench("tiny-llama", prompts, None, 6, ["ar"], base_only=True, command="ppdkit bench --x")
    assert report["command"] == "ppdkit bench --x"
    measured = datetime.fromisoformat(report["date"])
    assert measured.tzinfo is not None and abs(datetime.now(timezone.utc) - measured) < timedelta(minutes=10)
    machine = report["machine"]
    assert machine["logical_cores"] == os.cpu_count() and machine["torch_threads"] == torch.get_num_threads()
    assert machine["torch"] == torch.__version__ and machine["cpu"]
    assert set(machine["isa"]) <= set(bench.ISA_FLAGS)
    commit = machine["ppdkit_commit"]  # a checkout here: the commit it runs from
    assert commit is None or (len(commit) == 40 and int(commit, 16) >= 0)
    changed = machine["ppdkit_uncommitted"]
    assert (changed is None) == (commit is None) and all(isinstance(path, str) for path in changed or [])
    bench.print_table(report)
    assert f"measured {report['date']} on {machine['cpu']}" in capsys.readouterr().out


def test_a_report_names_the_package_files_that_differed_from_its_commit(tmp_path, tmp_path_factory):
    """A draft adopted but not yet committed, measured: the report says which files under ppdkit/ were not the
    commit's, and its caption names them; files outside ppdkit/ and untracked ones are not the package's."""
    import subprocess

    from ppdkit.registry.tracking import ppdkit_uncommitted

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    (tmp_path / "ppdkit" / "models").mkdir(parents=True)
    for name in ("ppdkit/models/weights.safetensors", "ppdkit/code.py", "README.md"):
        (tmp_path / name).write_text("committed")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    assert ppdkit_uncommitted(tmp_path) == []
    for name in ("ppdkit/models/weights.safetensors", "ppdkit/code.py", "README.md", "ppdkit/new.py"):
        (tmp_path / name).write_text("changed")
    changed = ppdkit_uncommitted(tmp_path)
    assert changed == ["ppdkit/code.py", "ppdkit/models/weights.safetensors"]
    assert ppdkit_uncommitted(tmp_path_factory.mktemp("installed")) is None  # not a checkout: nothing to say
    caption = bench.describe_commit({"ppdkit_commit": "0123456789abcdef", "ppdkit_uncommitted": changed})
    assert caption == ", ppdkit commit 0123456789 with 2 files changed: ppdkit/code.py, ppdkit/models/weights.safetensors"
    assert bench.describe_commit({"ppdkit_commit": "0123456789abcdef", "ppdkit_uncommitted": []}) == \
        ", ppdkit commit 0123456789"
    assert bench.describe_commit({}) == ""  # a report from before commits were recorded


def test_machine_info_reads_the_cpu_model_and_only_the_isa_flags_that_matter(tmp_path, monkeypatch):
    for name in bench.KERNEL_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    cpuinfo = tmp_path / "cpuinfo"
    core = "model name\t: Example Xeon 9999\nflags\t\t: fpu sse avx512f avx512_vnni amx_int8\n"
    cpuinfo.write_text(f"processor\t: 0\n{core}\nprocessor\t: 1\n{core}")
    machine = bench.machine_info(cpuinfo)
    assert machine["cpu"] == "Example Xeon 9999" and machine["isa"] == ["avx512f", "avx512_vnni", "amx_int8"]
    assert bench.describe_machine(machine).endswith("cores (%d threads), avx512f+avx512_vnni+amx_int8"
                                                    % torch.get_num_threads())
    unknown = bench.machine_info(tmp_path / "absent")  # not Linux: the platform's name, flags unknown
    assert unknown["isa"] is None and "ISA flags unknown" in bench.describe_machine(unknown)
    assert "gpu" not in bench.machine_info(cpuinfo, torch.device("cpu"))  # a GPU's report names it first:
    assert bench.describe_machine({**machine, "gpu": "NVIDIA H200"}).startswith("NVIDIA H200 beside Example Xeon")
    assert "kernel_settings" not in machine  # none set; a report timed with AMX left out of the build says so:
    monkeypatch.setenv("PPDKIT_NATIVE_CFLAGS", "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    kept_out = bench.machine_info(cpuinfo)
    assert kept_out["kernel_settings"] == {"PPDKIT_NATIVE_CFLAGS": "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
                                           "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
    assert bench.describe_machine(kept_out).endswith(
        "amx_int8, PPDKIT_NATIVE_CFLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16, ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16")


def _row(method, tokens_per_s, per_step, identical=1.0, **extra):
    return {"method": method, "prompts": 3, "tokens_per_s": tokens_per_s, "mean_accepted_per_step": per_step,
            "identical_to_greedy": identical, "speedup_vs_hf_greedy": tokens_per_s / 10.0,
            "speedup_vs_ar": tokens_per_s / 20.0, **extra}


HAND_MADE = {"model": "ppdkit/models/components/some-head", "prompts_source": "mt-bench", "max_new_tokens": 64, "repeats": 2,
             "date": "2026-11-25T10:00:00+00:00", "command": "ppdkit bench ...",
             "machine": {"cpu": "Example CPU", "logical_cores": 2, "torch_threads": 2, "isa": ["avx512f"]},
             "results": [_row("hf-greedy", 10.0, 1.0), _row("ar", 20.0, 1.0), _row("feature-head", 31.0, 2.4),
                         _row("anpd", 25.0, 1.6, identical=2 / 3), _row("auto", 30.0, 2.4, ran="feature-head")]}


def test_plot_report_draws_both_panels_at_the_documented_size(tmp_path):
    from PIL import Image

    from ppdkit.bench.plot import plot_report, title

    path = plot_report(HAND_MADE, tmp_path / "new" / "bench.png")
    assert path == tmp_path / "new" / "bench.png"
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1200, 500)
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20)) > 20  # drawn, not a blank canvas
    assert title(HAND_MADE) == ("some-head on mt-bench: 3 prompts, 64 new tokens, best of 2, weights float32\n"
                                "2026-11-25, Example CPU, 2 cores (2 threads), avx512f")
    old = {k: v for k, v in HAND_MADE.items() if k not in ("date", "machine", "command")}
    assert "\n" not in title(old)  # a report from before these fields still draws
    with pytest.raises(ValueError, match="no results to plot"):
        plot_report({**HAND_MADE, "results": []}, tmp_path / "empty.png")


def test_the_plot_writes_ratios_on_the_bars_and_marks_a_lossy_method():
    from ppdkit.bench.plot import _label, _ratios

    rows = {r["method"]: r for r in HAND_MADE["results"]}
    assert _ratios(rows["feature-head"]) == "1.55x ar, 3.10x greedy"
    assert _ratios(rows["anpd"]) == "1.25x ar, 2.50x greedy, identical 67%"
    assert _label(rows["auto"]) == "auto (feature-head)"


def test_ppdkit_bench_records_its_command_line_and_draws_the_plot(prompts, monkeypatch, tmp_path):
    from PIL import Image

    from ppdkit.cli.main import main

    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    argv = ["bench", "--base", "tiny-llama", "--prompts", prompts, "--max-new-tokens", "6", "--methods", "ar",
            "--out", str(tmp_path / "r.json"), "--plot", str(tmp_path / "plots" / "r.png")]
    assert main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["command"] == "ppdkit " + " ".join(argv)
    with Image.open(tmp_path / "plots" / "r.png") as image:
        assert image.size == (1200, 500)


def test_a_report_says_where_each_methods_step_time_goes(prompts, monkeypatch, tmp_path, capsys):
    """The prompt's read, and per step the drafting, the verification by rows, the drafter's accept and the rest: they
    add up to the answers' time, and a plain step is 1.00x itself."""
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path))
    report = bench.run_bench("tiny-llama", prompts, None, 12, ["ar", "anpd"], base_only=True)
    results = {r["method"]: r for r in report["results"]}
    assert "breakdown" not in results["hf-greedy"]  # transformers' generate: no steps of ours to time
    for method in ("ar", "anpd"):
        b, row = results[method]["breakdown"], results[method]
        assert b["steps"] == row["new_tokens"] / row["mean_accepted_per_step"] - row["prompts"]  # the prompt's aside
        parts = b["ms_per_step"]
        assert abs(parts["draft"] + parts["verify"] + parts["accept"] + parts["rest"] - b["step_ms"]) < 1e-6
        assert abs(b["steps"] * b["step_ms"] + row["prompts"] * b["prompt_ms"] - 1000 * row["seconds"]) < 1e-6
        assert sum(v["steps"] for v in b["verify_ms_by_rows"].values()) == b["steps"]
    assert list(results["ar"]["breakdown"]["verify_ms_by_rows"]) == ["1"] and results["ar"]["breakdown"][
        "step_vs_ar"] == 1.0
    bench.print_table(report)
    out = capsys.readouterr().out
    assert "where a step's time goes" in out and "verification by rows" in out
