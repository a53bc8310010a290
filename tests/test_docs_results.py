"""docs/results.md and its plots (docs/tools/results_page.py) stay those the bench reports in docs/results/ make."""

import json
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "tools" / "results_page.py"


@pytest.fixture(scope="module")
def tool():
    return runpy.run_path(str(SCRIPT))


def _row(method, tokens_per_s, per_step, identical=1.0, **extra):
    return {"method": method, "prompts": 3, "new_tokens": 192, "tokens_per_s": tokens_per_s,
            "mean_accepted_per_step": per_step, "mean_rows_per_step": None, "identical_to_greedy": identical,
            "speedup_vs_hf_greedy": tokens_per_s / 10.0, "speedup_vs_ar": tokens_per_s / 20.0, "divergences": [],
            **extra}


REPORT = {"model": "ppdkit/models/components/some-head", "prompts_source": "humaneval", "max_new_tokens": 64, "repeats": 2,
          "tree_size": 12, "date": "2026-11-25T10:00:00+00:00", "command": "ppdkit bench --model some-head",
          "machine": {"cpu": "Example CPU", "logical_cores": 2, "torch_threads": 2, "isa": ["avx512f"],
                      "torch": "2.13.0+cpu", "ppdkit_commit": "0123456789abcdef0123456789abcdef01234567"},
          "results": [_row("hf-greedy", 10.0, 1.0), _row("feature-head", 31.0, 2.4, mean_rows_per_step=13.0),
                      _row("ar", 20.0, 1.0),
                      _row("anpd", 25.0, 1.6, identical=2 / 3, divergences=[
                          {"prompt": 1, "index": 40, "top2_gap": 3e-5, "near_tie": True}]),
                      _row("auto", 30.0, 2.4, ran="feature-head")],
          "note": "measured while other work ran on the machine"}


def test_the_committed_results_page_and_plots_are_current(tool):
    assert tool["main"](["--check"]) == 0, "run python docs/tools/results_page.py"


def test_no_report_yet_is_said_with_what_to_run(tool, tmp_path):
    tool["write"](tmp_path / "absent", tmp_path / "results.md")
    assert "No report yet: measure with `ppdkit bench" in (tmp_path / "results.md").read_text()
    assert tool["stale"](tmp_path / "absent", tmp_path / "results.md") == []


def test_a_report_becomes_a_section_with_its_table_provenance_and_plot(tool):
    text = tool["section"]("head-humaneval", REPORT)
    lines = text.splitlines()
    assert lines[0] == "## head-humaneval"
    assert ("**some-head** on **humaneval**: 3 prompts, 64 new tokens, each prompt's fastest of 2 runs per method, "
            "tree size 12, weights float32.") in text  # a report from before the runtime had a dtype: float32
    assert ("Measured 2026-11-25T10:00:00+00:00 on Example CPU, 2 cores (2 threads), avx512f, torch 2.13.0+cpu, "
            "ppdkit commit 0123456789.") in lines
    assert "```\nppdkit bench --model some-head\n```" in text
    rows = [line for line in lines if line.startswith("| `")]
    assert [r.split("|")[1].strip() for r in rows] == ["`hf-greedy`", "`ar`", "`feature-head`", "`anpd`",
                                                       "`auto` (ran `feature-head`)"]  # baselines first
    assert "| `feature-head` | 31.0 | 1.55 | 3.10 | 2.40 | 13.0 | 3/3 (hf-greedy) |" in rows  # reports before dtypes
    assert "| `anpd` | 25.0 | 1.25 | 2.50 | 1.60 | - | 2/3 (hf-greedy) |" in rows
    assert "- `anpd`, prompt 1: parts from greedy at token 40, top-2 logit gap 3.0e-05 (a near-tie)" in lines
    assert "Note: measured while other work ran on the machine" in lines
    assert lines[-1] == "![head-humaneval: tokens/s and tokens per step by method](results/head-humaneval.png)"


def test_check_names_what_is_stale_until_the_page_is_written(tool, tmp_path):
    results, out = tmp_path / "results", tmp_path / "results.md"
    results.mkdir()
    (results / "head-humaneval.json").write_text(json.dumps(REPORT, indent=2))
    assert tool["stale"](results, out) == ["docs/results.md", "docs/results/head-humaneval.png"]
    tool["write"](results, out)
    assert tool["stale"](results, out) == []
    assert "](#head-humaneval): some-head on humaneval" in out.read_text()  # the contents link
    # a re-measured report: its section and its plot are both out of date
    (results / "head-humaneval.json").write_text(json.dumps({**REPORT, "date": "2026-11-26T10:00:00+00:00"}))
    assert tool["stale"](results, out) == ["docs/results.md", "docs/results/head-humaneval.png"]
    tool["write"](results, out)
    # a plot drawn by ppdkit bench --plot (no digest of its report) is redrawn by the tool, not trusted
    from ppdkit.bench.plot import plot_report

    plot_report(json.loads((results / "head-humaneval.json").read_text()), results / "head-humaneval.png")
    assert tool["stale"](results, out) == ["docs/results/head-humaneval.png"]


def test_a_file_that_is_not_a_bench_report_is_refused_by_name(tool, tmp_path):
    (tmp_path / "notes.json").write_text(json.dumps({"model": "x"}))
    with pytest.raises(ValueError, match="notes.json lacks prompts_source, results: it is not a ppdkit bench report"):
        tool["load_reports"](tmp_path)
    (tmp_path / "notes.json").write_text("{")
    with pytest.raises(ValueError, match="notes.json is not valid JSON"):
        tool["load_reports"](tmp_path)


def test_check_exits_1_naming_the_stale_file_and_the_command(tool, tmp_path, monkeypatch, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "head-humaneval.json").write_text(json.dumps(REPORT))
    monkeypatch.setitem(tool["main"].__globals__, "RESULTS", results)
    monkeypatch.setitem(tool["main"].__globals__, "OUT", tmp_path / "results.md")
    assert tool["main"](["--check"]) == 1
    assert capsys.readouterr().err == ("docs/results.md, docs/results/head-humaneval.png out of date: "
                                       "run python docs/tools/results_page.py\n")
