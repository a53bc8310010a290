"""ppdkit/jobs/gpu_lane.py, run here on the CPU with the tiny model and without the packages the GPU machine lacks (Ray,
DeepSpeed, MLflow, bitsandbytes, datasets: importing one fails): new corpus shards of its own seed, a draft trained
further from the starting component, held-out top-1 before and after, at most 8 files to bring back; then the shards
merge into another corpus here and the component loads and decodes losslessly."""

import json
import subprocess
import sys

import pytest
from conftest import kernels_or_skip
from test_adopt import _component
from test_corpus import TINY

from ppdkit.data_pipeline.corpus import CorpusError, merge_corpus, open_corpus, read_rows, unpack_corpus
from ppdkit.data_pipeline.corpus_grow import CorpusConfig, grow_corpus
from ppdkit.models.loading import load_base_model
from ppdkit.runtime.decoder import Decoder

ABSENT = ("ray", "deepspeed", "mlflow", "bitsandbytes", "datasets")
# as on a machine that never had them: an import fails, and a library asking whether one is there hears no
WITHOUT = f"""
import importlib.abc, importlib.util, sys
def absent(name):
    return name.split(".")[0] in {ABSENT!r}
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if absent(name):
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU machine)", name=name)
sys.meta_path.insert(0, Absent())
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: None if absent(name) else find_spec(name, package)
from ppdkit.jobs.gpu_lane import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_the_gpu_lane_runs_without_ray_deepspeed_mlflow_and_its_results_come_home(tmp_path):
    kernels_or_skip("native")
    base = load_base_model("tiny-llama")
    corpus, start = tmp_path / "corpus", _component(tmp_path / "start", base, scale=0.0)
    grow_corpus(corpus, CorpusConfig(**TINY), max_shards=2)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", WITHOUT, "--out", str(out), "--base", "tiny-llama", "--device", "cpu",
                           "--corpus-minutes", "0.02", "--train-minutes", "0.1", "--batch", "8",
                           "--rows-per-shard", "2", "--corpus", str(corpus), "--component", str(start),
                           "--micro-batch", "2", "--eval-sequences", "4"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "lane.json").read_text())
    grown, trained = report["stages"]["corpus"], report["stages"]["train"]
    assert grown["ok"] and grown["shards_written"] >= 1 and trained["ok"] and trained["steps"] >= 1
    assert len(trained["heldout_top1_before"]) == len(trained["heldout_top1_after"]) == 3
    assert trained["distributed"] == {"backend": "gloo", "world_size": 1}  # each step's gradients all-reduced
    back = [p for p in out.rglob("*") if p.is_file()]
    assert len(back) <= 8 and all(len(p.relative_to(out).parts) <= 3 for p in back)  # the device tool's limits
    assert report["corpus_parts"] and all((out / name).is_file() for name in report["corpus_parts"])
    (tmp_path / "back").mkdir()
    lane = open_corpus(unpack_corpus(out, tmp_path / "back"))
    assert {s["settings"]["seed"] for s in lane.shards} == {1} and all(s["engine"] for s in lane.shards)
    assert all(r.id.endswith("-s1") for r in read_rows(lane))  # other conversations than seed 0's of the same rows
    before = len(read_rows(open_corpus(corpus)))
    added = merge_corpus(open_corpus(corpus), lane)
    assert len(added) == len(lane.shards) and not merge_corpus(open_corpus(corpus), lane)
    merged = read_rows(open_corpus(corpus))
    assert len(merged) == before + sum(s["rows"] for s in added) == len({r.id for r in merged})
    decoder = Decoder.from_pretrained(out / "component", dtype="float32", tree_size=None)
    ids = [5, 17, 99, 5, 17, 99, 5, 17]
    assert decoder.generate(ids, max_new_tokens=16, method="eagle3-anpd").tokens == decoder.generate(ids,
                            max_new_tokens=16, method="ar").tokens


def test_a_corpus_of_another_model_does_not_merge(tmp_path):
    kernels_or_skip("native")
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    grow_corpus(ours, CorpusConfig(**TINY), max_shards=1)
    grow_corpus(theirs, CorpusConfig(**TINY), max_shards=1)
    other = open_corpus(theirs)
    other.manifest["fingerprint"] = "sha256:another"
    with pytest.raises(CorpusError, match="another base model"):
        merge_corpus(open_corpus(ours), other)


def test_a_shard_that_repeats_the_corpus_s_ids_does_not_merge(tmp_path):
    kernels_or_skip("native")
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    grow_corpus(ours, CorpusConfig(**TINY), max_shards=1)
    grow_corpus(theirs, CorpusConfig(**TINY), max_shards=1)  # the same rows, the same ids, in a shard named apart
    other = open_corpus(theirs)
    renamed = "shards/another-name.parquet"
    (theirs / other.shards[0]["file"]).rename(theirs / renamed)
    other.shards[0]["file"] = renamed
    with pytest.raises(CorpusError, match="repeats .* conversation ids"):
        merge_corpus(open_corpus(ours), other)
    assert len(open_corpus(ours).shards) == 1  # nothing copied


def test_a_packed_corpus_comes_apart_only_into_its_own_folder(tmp_path):
    import tarfile

    (tmp_path / "evil.txt").write_text("x")
    with tarfile.open(tmp_path / "corpus.tar", "w") as packed:
        packed.add(tmp_path / "evil.txt", arcname="../evil.txt")
    (tmp_path / "corpus.tar").rename(tmp_path / "corpus.tar.part-00")
    (tmp_path / "into").mkdir()
    with pytest.raises(CorpusError, match="holds what a corpus does not"):
        unpack_corpus(tmp_path, tmp_path / "into")
    with pytest.raises(CorpusError, match="no packed one"):
        unpack_corpus(tmp_path / "into", tmp_path)
