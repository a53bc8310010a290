"""docs/tools/scaling_table.py: a run's stage summaries become one row of the data-scaling table."""

import json
import runpy
from pathlib import Path

import pytest
import yaml

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "tools" / "scaling_table.py"


def _run(root: Path, name: str, positions, top1: float, per_step: float) -> Path:
    run = root / name
    summaries = {"teacher": {"splits": {"train": {"positions": 4_000_000}}},
                 "train": {"trained_positions": 2_000_000, "steps": 1000, "best_step": 750,
                           **{f"best_acc_top1_d{d}": top1 / d for d in range(1, 5)}},
                 "calibrate": {"tau_size8": 1.9, "tau_size16": 2.1, "tau_size32": 2.3},
                 "evaluate": {"tree_size": 8, "ar_accepted_per_step": 1.0, "ar_tokens_per_s": 50.0,
                              "feature_head_accepted_per_step": per_step, "feature_head_tokens_per_s": 80.0}}
    for stage, summary in summaries.items():
        (run / stage).mkdir(parents=True)
        (run / stage / "summary.json").write_text(json.dumps(summary))
    (run / "spec.yaml").write_text(yaml.safe_dump({"train": {"method": "feature-head", "train_positions": positions}}))
    return run


@pytest.fixture(scope="module")
def tool():
    return runpy.run_path(str(SCRIPT))


def test_a_row_holds_the_runs_figures_and_the_table_its_best_method(tool, tmp_path):
    rows = [tool["run_row"]("137k", _run(tmp_path, "a", 137000, 0.6, 1.8)),
            tool["run_row"]("full", _run(tmp_path, "b", None, 0.7, 2.1))]
    assert rows[0]["train_positions"] == 137000 and rows[1]["train_positions"] == 4_000_000  # null: all of it
    assert rows[0]["positions_seen"] == 2_000_000
    assert rows[1]["top1"][1] == 0.7 and rows[1]["tau"][16] == 2.1
    assert rows[1]["methods"]["feature_head"] == {"tokens_per_step": 2.1, "tokens_per_s": 80.0}
    table = tool["markdown"](rows)
    assert "| full | 4,000,000 | 2,000,000 | 0.700 | 0.350 |" in table and "feature_head: 2.10, 1.60x" in table


def test_a_run_whose_stage_is_missing_is_named(tool, tmp_path):
    run = _run(tmp_path, "c", 137000, 0.6, 1.8)
    (run / "evaluate" / "summary.json").unlink()
    with pytest.raises(SystemExit, match="its evaluate stage is not complete"):
        tool["run_row"]("137k", run)
