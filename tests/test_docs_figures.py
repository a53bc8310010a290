"""Figures in the hand-written pages come from committed reports (docs/tools/figure_blocks.py): every figures block
is what its report renders, and no page states a measured figure outside one."""

import json
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "tools" / "figure_blocks.py"

BENCH = {"model": "ppdkit/models/components/some-draft", "prompts_source": "mt-bench", "max_new_tokens": 128,
         "dtype": "bfloat16", "date": "2026-11-28T16:05:16+00:00", "command": "ppdkit bench --limit 3",
         "machine": {"cpu": "Example CPU", "logical_cores": 2, "torch_threads": 2, "isa": ["avx512f"],
                     "torch": "2.13.0+cpu", "ppdkit_commit": "0123456789abcdef"},
         "results": [{"method": "ar", "prompts": 3, "tokens_per_s": 80.0, "speedup_vs_ar": 1.0,
                      "mean_accepted_per_step": 1.0, "identical_to_greedy": 1.0, "compared_with": "ar"},
                     {"method": "eagle3", "prompts": 3, "tokens_per_s": 100.0, "speedup_vs_ar": 1.25,
                      "mean_accepted_per_step": 1.8, "identical_to_greedy": 1.0, "compared_with": "ar"}]}


@pytest.fixture(scope="module")
def tool():
    return runpy.run_path(str(SCRIPT))


@pytest.fixture
def docs(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "run.json").write_text(json.dumps(BENCH))
    return tmp_path


def test_every_committed_block_matches_its_report_and_no_page_states_a_figure_outside_one(tool):
    assert tool["main"](["--check"]) == 0, "run python docs/tools/figure_blocks.py, and move figures into reports"


def test_a_block_shows_the_reports_date_machine_command_and_figures(tool, docs):
    page = docs / "page.md"
    text = tool["rewrite"]("Intro.\n<!-- figures: results/run -->\nold\n<!-- /figures -->\nAfter.\n", page, docs)
    assert text.startswith("Intro.\n<!-- figures: results/run -->\nMeasured 2026-11-28 on Example CPU, 2 cores "
                           "(2 threads), avx512f, ppdkit commit 0123456789; `ppdkit bench --limit 3`.\n")
    assert "| `eagle3` | 100.0 | 1.25 | 1.80 | 3/3 (ar) |" in text
    assert "[run](results.md#run)" in text
    assert text.endswith("<!-- /figures -->\nAfter.\n")
    assert tool["rewrite"](text, page, docs) == text  # rendering is stable
    assert "[run](docs/results.md#run)" in tool["rewrite"](text, docs.parent / "README.md", docs)  # the README's links


def test_a_block_that_differs_from_its_report_fails_the_check(tool, docs):
    page = docs / "page.md"
    page.write_text(tool["rewrite"]("<!-- figures: results/run -->\n<!-- /figures -->\n", page, docs))
    assert tool["problems"](page, docs) == []
    page.write_text(page.read_text().replace("100.0", "120.0"))  # a figure edited by hand
    assert tool["problems"](page, docs) == ["its figures blocks differ from their reports: run "
                                            "python docs/tools/figure_blocks.py"]
    (docs / "results" / "run.json").write_text(json.dumps({**BENCH, "date": "2026-11-29T10:00:00+00:00"}))
    assert tool["problems"](page, docs)  # a re-measured report too


def test_a_block_naming_a_missing_or_unknown_report_is_refused(tool, docs):
    with pytest.raises(ValueError, match="no report docs/results/absent.json"):
        tool["rewrite"]("<!-- figures: results/absent -->\n<!-- /figures -->\n", docs / "page.md", docs)
    (docs / "results" / "notes.json").write_text(json.dumps({"what": "notes"}))
    with pytest.raises(ValueError, match="notes.json is not a report this tool renders"):
        tool["rewrite"]("<!-- figures: results/notes -->\n<!-- /figures -->\n", docs / "page.md", docs)


@pytest.mark.parametrize("sentence, kind", [
    ("`eagle3-anpd` ran 118.0 tok/s here.", "a speed"),
    ("It is 1.36x `ar` on MT-Bench.", "a ratio"),
    ("The draft keeps 2.18 tokens per step.", "tokens per step"),
    ("Its acceptance .44 is the best.", "an acceptance rate"),
    ("In 31% of the steps nothing is kept.", "an acceptance rate"),
    ("Measured on 2026-11-28 alone.", "a dated measurement"),
])
def test_a_measured_figure_in_prose_fails_the_lint(tool, sentence, kind):
    found = tool["measured_figures"](f"# A page\n\n{sentence}\n")
    assert found and found[0].startswith(f"line 3: {kind}: "), found


def test_a_table_of_measurements_fails_the_lint_and_a_block_or_code_passes_it(tool):
    table = "| method | x ar | tok/step |\n|---|---|---|\n| eagle3 | 1.18 | 1.83 |\n"
    assert tool["measured_figures"](table) == ["line 1: a table of measurements: '| method | x ar | tok/step |'"]
    assert tool["measured_figures"](f"<!-- figures: results/run -->\n{table}118.0 tok/s\n<!-- /figures -->\n") == []
    assert tool["measured_figures"]("```bash\nppdkit bench  # 118.0 tok/s, 1.36x ar\n```\n") == []


@pytest.mark.parametrize("sentence", [
    "`train.draft_vocab` (4096 by default) and `--tree-size 64`.",  # settings
    "7.5M numbers for SmolLM2 (fc 1.0M, the layer 4.1M).",  # sizes of models
    "The README stays under 150 lines; 35% of 60 sub-layers skipped.",  # line counts, a recipe's setting
    "x86-64 CPUs with AVX-512; a 3 x 1 prompt-token grid.",
])
def test_settings_sizes_and_counts_pass_the_lint(tool, sentence):
    assert tool["measured_figures"](sentence + "\n") == []


def test_a_component_model_card_is_linted_and_its_blocks_link_from_its_folder(tool, docs):
    """ppdkit/models/components/NAME/README.md is one of the pages: a figure in its prose fails the check, a block's
    links reach docs/ from that folder, and the `ppdkit adopt` history table must be what adopt writes."""
    root = docs.parent / "repo"
    (root / "docs").mkdir(parents=True)
    card = root / "ppdkit" / "models" / "components" / "some-draft" / "README.md"
    card.parent.mkdir(parents=True)
    card.write_text("# some-draft\n\nIt runs 1.38x `ar` on MT-Bench.\n")
    assert card in tool["pages"](root)
    assert tool["problems"](card, docs) == ["line 3: a ratio: '1.38x'"]

    card.write_text(tool["rewrite"]("# some-draft\n\n<!-- figures: results/run -->\n<!-- /figures -->\n", card, docs))
    assert f"[run]({tool['docs_prefix'](card, docs)}results.md#run)" in card.read_text()
    assert tool["docs_prefix"](card, root / "docs") == "../../../../docs/"
    assert tool["problems"](card, docs) == []

    adopt = tool["adopt"]
    row = {"date": "2026-11-29", "draft_vocab": 4096, "committed_tokens_per_step": 2.3654,
           "candidate_tokens_per_step": 2.3613, "adopted": False}
    (card.parent / adopt.HISTORY).write_text(json.dumps({"rows": [row]}))
    table = adopt.history_table([row])
    card.write_text(card.read_text() + f"\n## History\n\n{adopt.BEGIN}\n{table}{adopt.END}\n")
    assert tool["problems"](card, docs) == []  # adopt's table is generated, not prose
    card.write_text(card.read_text().replace("2.361", "2.461"))  # edited by hand
    assert tool["problems"](card, docs) == ["its `ppdkit adopt` history table differs from some-draft/history.json: "
                                            "rerun ppdkit/jobs/adopt.py's write_history_table"]


def test_a_training_evals_report_renders_each_runs_top1_by_distance(tool, docs, tmp_path):
    """docs/tools/training_evals.py's report from a run's records (the latest checkpoint when it has more evaluations
    than the best one), rendered as a table per run; no machine path is recorded."""
    evals = [{"step": s, "eval_positions": 900, **{f"acc_top1_d{d}": v / d for d in (1, 2)},
              **{f"acc_top10_d{d}": 2 * v / d for d in (1, 2)}} for s, v in ((0, 0.3), (50, 0.4))]
    run = tmp_path / "run"
    (run / "train" / "best").mkdir(parents=True)
    (run / "train" / "checkpoints" / "step-000050").mkdir(parents=True)
    (run / "train" / "best" / "meta.json").write_text(json.dumps({"evals": evals[:1]}))
    (run / "train" / "checkpoints" / "step-000050" / "meta.json").write_text(json.dumps({"evals": evals}))
    writer = runpy.run_path(str(ROOT / "docs" / "tools" / "training_evals.py"))
    report = writer["report"]("some-training", [("the pairs", run, "ppdkit run some.yaml")], 64, None)
    assert str(tmp_path) not in json.dumps(report) and report["runs"][0]["eval_positions"] == 900
    (docs / "measurements").mkdir()
    (docs / "measurements" / "some-training.json").write_text(json.dumps(report))
    text = tool["rewrite"]("<!-- figures: measurements/some-training -->\n<!-- /figures -->\n", docs / "p.md", docs)
    assert "the pairs: `ppdkit run some.yaml`" in text and "| 50 | 0.400 | 0.200 | 0.400 |" in text


def test_a_serving_load_block_says_a_drafting_servers_answers_against_its_plain_twins(tool, docs):
    level = {"clients": 1, "requests": 2, "tokens_per_s": 50.0, "ttft_ms_p50": 10.0, "ttft_ms_p99": 20.0,
             "tpot_ms_p50": 5.0, "tpot_ms_p99": 6.0, "latency_s_p50": 1.0, "peak_rss_mib": 100.0, "identical": 2}
    report = {"kind": "serving-load", "date": "2026-12-07", "machine": BENCH["machine"], "command": "c", "prompts": 2,
              "prompts_source": "mt-bench", "max_tokens": 8, "source": "x", "method": "auto", "per_token_latency": "p",
              "servers": [{"name": "llama.cpp", "status": "ran", "startup_s": 1.0, "levels": [level]},
                          {"name": "llama.cpp-eagle3", "status": "ran", "startup_s": 1.0, "levels": [level],
                           "same_as_plain": {"server": "llama.cpp", "equal": 1, "compared": 2}}]}
    (docs / "measurements").mkdir()
    (docs / "measurements" / "load.json").write_text(json.dumps(report))
    text = tool["rewrite"]("<!-- figures: measurements/load -->\n<!-- /figures -->\n", docs / "p.md", docs)
    assert "`llama.cpp-eagle3`'s answers at 1 client equal to `llama.cpp`'s (the same server without the draft): 1/2" \
        in text
