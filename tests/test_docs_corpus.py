"""docs/tools/corpus_page.py: docs/corpus.md is generated from the committed corpus, measurements and draft history."""

import json
import runpy
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "tools" / "corpus_page.py"


@pytest.fixture(scope="module")
def tool():
    return runpy.run_path(str(SCRIPT))


def _corpus_grown_since_commit() -> bool:
    """Whether the corpus's manifest differs from the committed one (a corpus job at work in this checkout)."""
    manifest = SCRIPT.parents[2] / "ppdkit" / "data_pipeline" / "corpora" / "smollm2-135m" / "corpus.json"
    done = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(manifest)], cwd=SCRIPT.parents[2],
                          capture_output=True)
    return done.returncode == 1


def test_the_committed_corpus_page_is_current(tool):
    if _corpus_grown_since_commit():
        pytest.skip("the corpus has grown since the last commit: the page is made again when its shards are committed")
    assert tool["main"](["--check"]) == 0, "docs/corpus.md is out of date: run python docs/tools/corpus_page.py"


def test_a_stale_page_exits_1_saying_what_to_run(tool, tmp_path, capsys):
    stale = tmp_path / "corpus.md"
    stale.write_text(tool["render"]().replace("| **all** |", "| all |"))
    original = tool["main"].__globals__["OUT"]
    tool["main"].__globals__["OUT"] = stale
    try:
        assert tool["main"](["--check"]) == 1
        assert "is out of date: run python docs/tools/corpus_page.py" in capsys.readouterr().err
    finally:
        tool["main"].__globals__["OUT"] = original


def test_draft_gap_reads_the_run_s_held_out_prompts_from_the_committed_corpus(tmp_path):
    import datasets

    from ppdkit.data_pipeline.corpus import committed_corpus, open_corpus, read_rows

    gap = runpy.run_path(str(SCRIPT.parent / "draft_gap.py"))
    rows = read_rows(open_corpus(committed_corpus("smollm2-135m")))
    by_group = {}
    for row in rows:
        by_group.setdefault(row.source.split("-")[0], []).append(row)
    held = [by_group["sharegpt"][0], by_group["magpie"][0], by_group["magpie"][1], by_group["chitchat"][0]]
    datasets.Dataset.from_dict({"id": [r.id for r in held]}).save_to_disk(str(tmp_path / "data" / "holdout"))
    prompts = gap["held_out_prompts"](tmp_path, limit=1)  # one a group: the first magpie row only
    assert {g: len(p) for g, p in prompts.items()} == {"magpie": 1, "sharegpt": 1, "chitchat": 1}
    first = held[1]
    assert prompts["magpie"][0] == first.input_ids[:first.answer_spans[0][0]]  # the ids before the first answer
    # an earlier run of the lineage trained on the first magpie row: the second one is measured instead
    datasets.Dataset.from_dict({"id": [first.id]}).save_to_disk(str(tmp_path / "earlier" / "data" / "train"))
    again = gap["held_out_prompts"](tmp_path, limit=1, trained=(tmp_path / "earlier",))
    assert again["magpie"][0] == held[2].input_ids[:held[2].answer_spans[0][0]]
    datasets.Dataset.from_dict({"id": ["not-in-the-corpus"]}).save_to_disk(str(tmp_path / "data" / "holdout"))
    with pytest.raises(SystemExit, match="not in the committed corpus"):
        gap["held_out_prompts"](tmp_path, limit=1)


def test_the_gap_table_has_a_row_a_prompt_set(tool):
    report = {"sets": {"mt-bench": {"prompts": 80, "tokens_per_step": 2.41, "kept_share": [.6, .4, .2, .1, .05]},
                       "held-out magpie": {"prompts": 40, "tokens_per_step": 2.9, "kept_share": [.7, .5, .3, .2, .1]}},
              "heldout_top1": [.66, .62, .6, .57], "run": "r", "date": "2026-11-29"}
    section = tool["gap_section"](report)
    assert "| mt-bench | 80 | 2.410 | .600/.400/.200/.100/.050 |" in section
    assert "| held-out magpie | 40 | 2.900 |" in section and ".660/.620/.600/.570" in section


def _row(adopted: bool, positions: int, before: float, after: float) -> dict:
    return {"adopted": adopted, "trained_positions": positions, "committed_tokens_per_step": before,
            "candidate_tokens_per_step": after, "date": "2026-11-30"}


def test_the_cost_curve_counts_the_adopted_lineage_s_positions_and_fits_them_in_log2():
    curve = runpy.run_path(str(SCRIPT.parent / "draft_curve.py"))
    # a thrown-away run's positions are not the lineage's: 1M, then (2M rejected), then 1M more = 2M
    rows = [_row(True, 1_000_000, 2.30, 2.40), _row(False, 2_000_000, 2.40, 2.39), _row(True, 1_000_000, 2.40, 2.45)]
    start, points = curve["lineage"](rows)
    assert start == 2.30 and [p.positions for p in points] == [1_000_000, 2_000_000]
    fit = curve["log_fit"](points)
    assert abs(fit.per_doubling - 0.05) < 1e-12  # one doubling, +.05
    assert abs(fit.positions_for(2.60) - 16_000_000) < 1  # three more doublings from 2M
    text = curve["section"](rows, {"a machine": 1000.0}, "images/x.png")
    assert "+0.050 tokens per step each time" in text and "about **16M positions**" in text
    assert "a machine: 4 hours at 1,000 positions/s" in text and "](images/x.png)" in text


def test_a_change_of_the_measure_between_runs_moves_every_point_not_the_slope():
    curve = runpy.run_path(str(SCRIPT.parent / "draft_curve.py"))
    # the second run's gate measured the committed draft at 2.45, not the 2.40 its own run had: the measure changed
    rows = [_row(True, 1_000_000, 2.30, 2.40), _row(True, 1_000_000, 2.45, 2.50)]
    start, points = curve["lineage"](rows)
    assert abs(start - 2.35) < 1e-12 and [round(p.tokens_per_step, 12) for p in points] == [2.45, 2.50]
    assert abs(curve["log_fit"](points).per_doubling - 0.05) < 1e-12  # the second run's gain, not its jump of .10


def test_a_curve_that_does_not_rise_asks_no_positions():
    curve = runpy.run_path(str(SCRIPT.parent / "draft_curve.py"))
    rows = [_row(True, 1_000_000, 2.3, 2.45), _row(True, 1_000_000, 2.45, 2.40)]
    assert curve["log_fit"](curve["lineage"](rows)[1]).positions_for(2.6) is None
    assert "more of the same data is not the way" in curve["section"](rows, {}, None)
    assert "no curve" in curve["section"](rows[:1], {}, None)


def test_the_second_layer_section_says_what_the_ab_measured(tool):
    report = {"settings": {"steps": 2, "batch": 8, "lr": 3e-4, "depth": 4}, "started_from": "d", "heldout_sequences": 9,
              "date": "2026-12-01T00:00:00+00:00", "machine": {"cpu": "Some CPU"},
              "train_seconds": {"one layer": 10.0, "two layers": 19.0},
              "evals": [{"step": 0, "positions": 0, "one layer": [.7, .6], "two layers": [.7, .6]},
                        {"step": 2, "positions": 900, "one layer": [.71, .6], "two layers": [.73, .59]}]}
    text = tool["layers_section"](report)
    assert "| 2 | 900 | .710/.600 | .730/.590 |" in text
    assert "+0.0200/-0.0100 at distances 1-2" in text and "1.90x" in text and "ended +0.0100 from it" in text


def test_the_objective_section_compares_every_arm_with_the_arm_at_0(tool):
    arms = {"top1 share 0": {"top1_share": 0.0}, "top1 share 0.5": {"top1_share": 0.5}}
    report = {"settings": {"steps": 2, "batch": 8, "lr": 3e-4, "depth": 2, "precision": "bf16-autocast"},
              "started_from": "d", "heldout_sequences": 9, "date": "2026-12-05T00:00:00+00:00",
              "machine": {"cpu": "Some CPU"}, "arms": arms, "identical": 80,
              "evals": [{"step": 0, "positions": 0, "top1 share 0": [.7, .6], "top1 share 0.5": [.7, .6],
                         "top5": {"top1 share 0": [.8, .7], "top1 share 0.5": [.8, .7]}},
                        {"step": 2, "positions": 900, "top1 share 0": [.71, .6], "top1 share 0.5": [.72, .61],
                         "top5": {"top1 share 0": [.81, .7], "top1 share 0.5": [.8, .72]}}],
              "gate": {"measure": {"prompts": "mt-bench", "limit": 80, "method": "eagle3-anpd", "tree_size": 8,
                                   "dtype": "float32"},
                       "top1 share 0": {"tokens_per_step": 2.5, "kept_share": [.7, .4, .2, .1, .05]},
                       "top1 share 0.5": {"tokens_per_step": 2.52, "kept_share": [.71, .41, .2, .1, .05]}}}
    text = tool["objective_section"](report)
    assert "| 2 | 900 | .710/.600 | .720/.610 |" in text
    assert "| top1 share 0.5 | .720/.610 | .800/.720 | 2.520 | .710/.410/.200/.100/.050 |" in text
    assert "top1 share 0.5 +0.020 tokens per step (top-1 d1 +0.0100)" in text and "80 of 80 prompts" in text


def test_the_corpus_chain_measure_is_on_the_page_and_was_lossless(tool):
    """docs/tools/corpus_chain.py's report: both methods' tokens per step on the page, under the heading that
    docs/methods.md links to, and the same tokens from both on every prompt."""
    report = json.loads((SCRIPT.parents[1] / "measurements" / "corpus-chain.json").read_text())
    page = tool["render"]()
    assert "## The corpus as a drafter: eagle3-corpus" in page
    for method, figures in report["methods"].items():
        assert f"| `{method}` | {figures['tokens_per_step']:.3f} |" in page
    assert report["identical"] == report["prompts"] == 80


def test_the_fitted_values_measure_is_on_the_page_and_was_lossless(tool):
    """docs/tools/fitted_values.py's report: both methods' tokens per step both ways on the page, under the heading
    docs/methods.md links to, the same tokens from all four on every prompt, and the weights the component ships."""
    from ppdkit.runtime.trees.tree_values import TreeValues

    report = json.loads((SCRIPT.parents[1] / "measurements" / "tree-values.json").read_text())
    page = tool["render"]()
    assert "## Fitted tree values" in page and "(methods.md#eagle3-eagle3-anpd-eagle3-corpus)" in page
    for method, figures in report["methods"].items():
        assert f"| `{method}` | {figures['own']['tokens_per_step']:.3f} | {figures['fitted']['tokens_per_step']:.3f} |" \
            in page
    assert report["identical"] == report["prompts"] == 80
    shipped = json.loads((SCRIPT.parents[2] / "ppdkit" / "models" / "components" / "smollm2-135m-eagle3" /
                          "tree_values.json").read_text())
    assert TreeValues.from_json(shipped).to_json()["weights"] == report["weights"]  # the model the report measured
