"""`ppdkit adopt`, continual training's gate: the candidate replaces the committed draft only when it keeps more
tokens per step on the fixed measure, the two give the same tokens, and every candidate is in the history table."""

import json

import torch
from test_eagle3 import _draft_tensors

from ppdkit.jobs.adopt import BEGIN, adopt, history_table, kept_shares, run_figures, write_history_table
from ppdkit.models.artifact import read_component, write_component
from ppdkit.models.loading import load_base_model

HYPER = {"head_kind": "eagle3", "aux_layers": [1, 1, 1], "head_depth": 3, "draft_vocab": 128, "loss": "kd",
         "alpha": 0.8, "lr": 0.001, "epochs": 1, "seed": 0, "precision": "fp32"}


def _component(path, base, scale: float):
    vocab = torch.arange(128)
    tensors = {**_draft_tensors(base.model, vocab, seed=1, scale=scale), "draft_vocab": vocab}
    write_component(path, "eagle3", HYPER, "tiny-llama", base.fingerprint, {"step": 0}, tensors)
    (path / "README.md").write_text(f"# {path.name}\n\nA tiny draft.\n")
    return path


def test_a_better_draft_replaces_the_committed_one_and_both_are_recorded(tmp_path):
    base = load_base_model("tiny-llama")
    committed = _component(tmp_path / "committed", base, scale=3.0)  # a draft that guesses badly
    good = _component(tmp_path / "good", base, scale=0.0)
    (tmp_path / "run" / "train").mkdir(parents=True)
    (tmp_path / "run" / "train" / "result.json").write_text(json.dumps(
        {"evals": [{"step": 0, "acc_top1_d1": 0.2, "acc_top1_d2": 0.1}, {"step": 5, "acc_top1_d1": 0.4,
                                                                          "acc_top1_d2": 0.3}],
         "best_step": 5, "trained_positions": 12345}))
    worse = adopt(committed, good, limit=2)  # the bad draft as candidate: kept out
    assert not worse["adopted"] and worse["candidate_tokens_per_step"] <= worse["committed_tokens_per_step"]
    assert read_component(good).tensors["fc.weight"].dtype == torch.float32  # untouched
    # the corpus the run's data stage read, not the committed one as it has grown since
    (tmp_path / "run" / "data").mkdir()
    (tmp_path / "run" / "data" / "summary.json").write_text(json.dumps({"datasets": [
        {"name": "corpus", "context": "training", "profile": {"tokens": 1_900_000}},
        {"name": "corpus", "context": "validation", "profile": {"tokens": 100_000}}]}))
    row = adopt(good, committed, tmp_path / "run", corpus_tokens=3_000_000, limit=2)
    assert row["candidate_tokens_per_step"] > row["committed_tokens_per_step"] and row["adopted"]
    assert row["corpus_tokens"] == 2_000_000
    assert row["heldout_top1_start"] == [0.2, 0.1] and row["heldout_top1"] == [0.4, 0.3]
    for shares in (row["committed_kept_share"], row["candidate_kept_share"]):  # a share of steps by depth
        assert len(shares) == 5 and all(1 >= a >= b >= 0 for a, b in zip(shares, shares[1:]))
    assert sum(row["candidate_kept_share"]) > sum(row["committed_kept_share"])  # more guesses kept a step
    replaced = read_component(committed)  # sha256 of every listed file checked
    assert replaced.tensors["fc.weight"].dtype == torch.float16
    torch.testing.assert_close(replaced.tensors["fc.weight"].float(), read_component(good).tensors["fc.weight"],
                               rtol=1e-3, atol=1e-3)
    readme = (committed / "README.md").read_text()
    assert readme.startswith("# committed") and BEGIN in readme and "| **yes** |" in readme and "2.00M" in readme
    assert not write_history_table(committed)  # current: nothing to rewrite
    assert history_table([]).count("\n") == 2


def test_kept_shares_count_the_steps_that_kept_each_depth():
    # steps emitting 1 (nothing kept), 2, 4 and 6 tokens: >=1 kept in 3 of 4, >=2 in 2, >=3 in 2, >=4 and >=5 in 1
    assert kept_shares([1, 2, 4, 6]) == [0.75, 0.5, 0.5, 0.25, 0.25]
    assert kept_shares([]) == [0.0] * 5


def test_a_gpu_lanes_report_gives_the_history_its_figures(tmp_path):
    trained = {"ok": True, "steps": 202, "positions": 1444215, "heldout_top1_before": [0.69, 0.66, 0.63, 0.61],
               "heldout_top1_after": [0.7, 0.67, 0.64, 0.61]}
    (tmp_path / "lane.json").write_text(json.dumps({"stages": {"corpus": {"ok": False}, "train": trained}}))
    assert run_figures(tmp_path) == {"heldout_top1_start": [0.69, 0.66, 0.63, 0.61],
                                     "heldout_top1": [0.7, 0.67, 0.64, 0.61], "trained_positions": 1444215,
                                     "best_step": 202}
    (tmp_path / "lane.json").write_text(json.dumps({"stages": {"train": {"ok": False, "error": "OOM"}}}))
    assert run_figures(tmp_path) == {}  # a lane whose training failed has no figures to give


def test_prompt_tokens_are_gated_on_their_own_method_and_an_equal_candidate_is_kept_out(tmp_path):
    """A PPD component is measured with `ppd` on its tree of 16 input rows; a candidate no better than the committed
    one (here its copy) is recorded and not adopted."""
    import shutil

    from conftest import write_tiny_ppd_component

    from ppdkit.jobs.adopt import measure_for
    from ppdkit.models.artifact import add_files
    from ppdkit.runtime.trees.tree import best_tree_for_size

    committed = write_tiny_ppd_component(tmp_path / "committed")
    table = [[0.5, 0.2], [0.3, 0.1], [0.2]]
    add_files(committed, json_files={"trees": {"trees": {str(n): best_tree_for_size(table, n).to_json()
                                                         for n in (8, 16)}}})
    candidate = tmp_path / "candidate"
    shutil.copytree(committed, candidate)
    before = (committed / "weights.safetensors").read_bytes()
    row = adopt(candidate, committed, limit=2)
    assert row["measure"]["method"] == measure_for("ept")["method"] == "ppd" and row["measure"]["tree_size"] == 16
    assert row["candidate_tokens_per_step"] == row["committed_tokens_per_step"] >= 1.0 and not row["adopted"]
    assert row["draft_vocab"] is None and (committed / "weights.safetensors").read_bytes() == before
    assert "| no |" in (committed / "README.md").read_text()
