"""train.online (ppdkit/trainer/online_teacher.py): the frozen base computes the targets and features in the training step,
exactly the teacher stage's, and EAGLE-3 trains on them without a teacher cache."""

import math

import pytest
import torch
from datasets import load_from_disk
from test_eagle3 import EAGLE3_TRAIN
from test_training import BASE

from ppdkit.data_pipeline.teacher_cache import TeacherCache
from ppdkit.jobs.spec import SpecError, spec_from_dict
from ppdkit.models.eagle3 import aux_layers
from ppdkit.models.loading import load_base_model
from ppdkit.registry.tracking import TrackerRef
from ppdkit.runtime.decoder import Decoder
from ppdkit.trainer.config import TrainConfig
from ppdkit.trainer.features import FeatureCache, teacher_runtime
from ppdkit.trainer.launch import run_training
from ppdkit.trainer.online_teacher import OnlineTeacher


def test_online_targets_and_features_are_the_teacher_stages(teacher_dir):
    """The same top-k ids and log-probabilities as the teacher cache (same dtype, same engine), and the same EAGLE-3
    states as the trainer computes for a cache, from one forward per sequence, computed once while they fit."""
    cache = TeacherCache(teacher_dir)
    base = load_base_model("tiny-llama", "none", cache.float_dtype)
    teacher = OnlineTeacher(base.model, cache.manifest["top_k"], keep_bytes=1e9)
    layers = aux_layers(base.model.config.num_hidden_layers)
    teacher.serve_features(layers)
    online = teacher.sequences(load_from_disk(str(teacher_dir.parent / "data" / "train")), "train")
    features = FeatureCache(base.model, layers)
    features.compute_on(teacher_runtime(base.model, cache))
    assert teacher.engine == ("runtime" if features.runtime is not None else "transformers")
    cached = list(cache.sequences("train"))
    assert cached
    for seq in cached:
        mine = online[seq.row]
        assert torch.equal(mine.input_ids, seq.input_ids) and torch.equal(mine.positions, seq.positions)
        assert torch.equal(mine.topk_ids.long(), seq.topk_ids.long())
        assert torch.equal(mine.topk_logprobs.to(seq.topk_logprobs.dtype), seq.topk_logprobs)
        assert torch.equal(features(mine, "train"), features._compute(seq.input_ids).float())
    assert teacher.forwards == len(cached)  # every read after the first is the kept result
    mine.topk_ids, mine.features  # noqa: B018  (read again)
    assert teacher.forwards == len(cached)


def test_eagle3_trains_online_and_decodes_losslessly(teacher_dir, tmp_path):
    """No teacher cache: the workers read the data stage's rows (teacher_dir names nothing that exists)."""
    online = {"data_dir": str(teacher_dir.parent / "data"), "compute_dtype": "float32", "top_k": 16}
    result = run_training(BASE, EAGLE3_TRAIN.model_copy(update={"online": True}), tmp_path / "no-teacher",
                          tmp_path / "train", TrackerRef(), online=online)
    losses = [loss for _, loss in result["history"]]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    assert set(result["best"]) >= {"acc_top1_d1", "acc_top1_d3"}
    decoder = Decoder.from_pretrained(tmp_path / "train" / "component", dtype="float32", tree_size=None)
    ids = [5, 17, 99, 5, 17, 99, 5, 17]
    assert decoder.generate(ids, max_new_tokens=16, method="eagle3-anpd").tokens == decoder.generate(ids,
                            max_new_tokens=16, method="ar").tokens


def test_a_feature_head_trains_online_and_calibrates_on_the_data_stages_held_out_rows(teacher_dir, tmp_path):
    """The feature head, online: trained, then its trees calibrated on the held-out rows of the
    data stage (no teacher cache anywhere), loadable and lossless."""
    from test_training import train_as

    from ppdkit.models.artifact import add_files
    from ppdkit.trainer.calibrate import calibrate

    online = {"data_dir": str(teacher_dir.parent / "data"), "compute_dtype": "float32", "top_k": 16}
    cfg = train_as("feature-head", groups_per_sequence=4, head_depth=3, draft_vocab=128, lr=0.001, online=True)
    result = run_training(BASE, cfg, tmp_path / "no-teacher", tmp_path / "train", TrackerRef(), online=online)
    assert all(math.isfinite(loss) for _, loss in result["history"]) and "acc_top1_d1" in result["best"]
    component = tmp_path / "train" / "component"
    trees = calibrate("tiny-llama", component, tmp_path / "no-teacher", [4, 8], 10, 4, 4, 2, online=online)
    assert trees["kind"] == "heads" and trees["split"] == "holdout" and trees["sequences"] > 0
    assert set(trees["trees"]) == {"4", "8"} and trees["dtype"] == "float32"
    add_files(component, json_files={"trees": trees})
    decoder = Decoder.from_pretrained(component, dtype="float32", tree_size=8)
    ids = [5, 17, 99, 5, 17, 99, 5, 17]
    assert decoder.generate(ids, max_new_tokens=16, method="feature-head").tokens == decoder.generate(ids,
                            max_new_tokens=16, method="ar").tokens


def test_prompt_tokens_train_online_and_calibrate_with_an_ngram_table_from_the_data_stages_rows(teacher_dir, tmp_path):
    """ept, online: the targets alone are computed (no states kept beside them), the prompt tokens train, their trees
    are calibrated on the data stage's held-out rows and the n-gram table counted from its training rows: no teacher
    cache anywhere, and the component decodes as `ar` does."""
    from test_training import train_as

    from ppdkit.data_pipeline.ngram_cache import assistant_texts, build_ngram_table, data_stage_sequences
    from ppdkit.models.artifact import add_files, write_ngrams
    from ppdkit.trainer.calibrate import calibrate

    data_dir = teacher_dir.parent / "data"
    online = {"data_dir": str(data_dir), "compute_dtype": "float32", "top_k": 16}
    cfg = train_as("ept", groups_per_sequence=4, online=True)
    result = run_training(BASE, cfg, tmp_path / "no-teacher", tmp_path / "train", TrackerRef(), online=online)
    assert all(math.isfinite(loss) and loss > 0 for _, loss in result["history"]) and "acc_top1_d1" in result["best"]
    component = tmp_path / "train" / "component"
    trees = calibrate("tiny-llama", component, tmp_path / "no-teacher", [4, 8], 10, 4, 4, 2, online=online)
    assert trees["kind"] == "ppd" and trees["split"] == "holdout" and trees["insertions"] > 0
    cached = [list(t) for t in assistant_texts(TeacherCache(teacher_dir).sequences("train"))]
    assert cached and [list(t) for t in assistant_texts(data_stage_sequences(data_dir))] == cached  # the same text
    add_files(component, json_files={"trees": trees})
    write_ngrams(component, build_ngram_table(cached, min_count=1).to_tensors())
    decoder = Decoder.from_pretrained(component, dtype="float32", tree_size=8)
    for ids in ([5, 17, 99, 5, 17, 99, 5, 17], [3, 4, 5, 6, 7]):
        plain = decoder.generate(ids, max_new_tokens=16, method="ar").tokens
        assert all(decoder.generate(ids, max_new_tokens=16, method=m).tokens == plain for m in ("ppd", "ppd-lookup"))


def test_online_targets_alone_keep_no_states():
    base = load_base_model("tiny-llama", "none", "float32")
    teacher = OnlineTeacher(base.model, 8, keep_bytes=1e9)
    teacher.serve_targets_only()
    seq = teacher.sequences([{"input_ids": [1, 5, 17, 99, 5, 17], "loss_mask": [0, 0, 1, 1, 1, 1]}], "train")[0]
    assert seq.features is None and seq.topk_ids.shape == (4, 8)
    teacher.serve_features(None)  # the final states, for the heads over them
    assert teacher.sequences([{"input_ids": [1, 5, 17], "loss_mask": [0, 1, 1]}], "t")[0].features.shape[0] == 3


def test_online_trains_from_the_bases_own_float_model():
    assert TrainConfig(method="medusa", online=True).online and TrainConfig(method="ept", online=True).online
    with pytest.raises(ValueError, match="early-head.online\n  Extra inputs are not permitted"):
        TrainConfig(method="early-head", online=True)
    with pytest.raises(SpecError, match="set base_model.quantization none"):  # the targets are the verifier's
        spec_from_dict({"name": "x", "train": {"method": "ept", "online": True}})
    with pytest.raises(ValueError, match="keeps none on disk"):
        TrainConfig(method="eagle3", online=True, features_on_disk=True)
    with pytest.raises(SpecError, match="set teacher.compute_dtype auto"):
        spec_from_dict({"name": "x", "base_model": {"quantization": "none"}, "train": {"method": "eagle3",
                        "online": True}, "teacher": {"compute_dtype": "q4"},
                        "evaluate": {"methods": ["ar", "eagle3"]}})


@pytest.mark.slow
def test_a_job_trains_online_on_a_corpus_and_a_grown_corpus_is_a_new_input(ray_local, tracking_uri, tmp_path, capsys):
    """data.source a corpus folder, train.online: the teacher stage is skipped and the component is written; after
    the corpus grows, the data stage made from it is out of date (a rerun without --force is refused)."""
    import yaml
    from test_corpus import TINY

    from ppdkit.data_pipeline.corpus_grow import CorpusConfig, grow_corpus
    from ppdkit.cli.main import main

    corpus = tmp_path / "corpus"
    grow_corpus(corpus, CorpusConfig(**TINY), max_shards=2)
    spec = {"name": "online", "base_model": {"name": "tiny-llama", "quantization": "none"},
            "data": {"source": str(corpus), "limit": None, "max_length": 320, "holdout": 0.25, "shards": 1,
                     "check_sequences": 0},
            "teacher": {"compute_dtype": "float32", "top_k": 16},
            "train": {"method": "eagle3", "online": True, "head_depth": 2, "draft_vocab": 128, "num_workers": 1,
                      "micro_batch": 1, "max_steps": 2, "eval_every": 1, "checkpoint_every": 1, "eval_sequences": 2},
            "evaluate": {"methods": ["ar", "eagle3"]}}
    path, out = tmp_path / "job.yaml", tmp_path / "out"
    path.write_text(yaml.safe_dump(spec))
    assert main(["run", str(path), "--stages", "data,train", "--output", str(out)]) == 0
    assert (out / "train" / "component" / "component.json").is_file() and not (out / "teacher").exists()
    grow_corpus(corpus, CorpusConfig(**TINY), max_shards=1)
    capsys.readouterr()
    assert main(["run", str(path), "--stages", "data", "--output", str(out)]) == 2
    assert "corpus_digest" in capsys.readouterr().err


def test_the_online_benchmark_times_both_modes_on_the_same_batches(teacher_dir):
    from ppdkit.data_pipeline.config import TeacherConfig
    from ppdkit.bench.eagle3_online import MODES, online_benchmark

    report = online_benchmark(BASE, EAGLE3_TRAIN, TeacherConfig(compute_dtype="float32", top_k=16),
                              teacher_dir.parent / "data", batches=2, threads=1)
    assert [r["mode"] for r in report["results"]] == list(MODES)
    first, second = report["results"]
    assert first["positions"] == second["positions"] > 0 and first["tokens"] == second["tokens"]
    assert report["speedup"] > 0 and report["threads"] == 1
    # the warm-up batch, then each timed sequence off the clock and on it
    assert report["base_forwards"] == EAGLE3_TRAIN.micro_batch * (1 + 2 * 2)
    with pytest.raises(ValueError, match="bench-online measures eagle3, not feature-head"):
        online_benchmark(BASE, TrainConfig(method="feature-head"), TeacherConfig(), teacher_dir.parent / "data")


def test_a_padded_forward_of_many_sequences_gives_each_its_own_results(teacher_dir):
    """prefetch (a GPU's engine, transformers): one forward of a micro-batch, right-padded, gives each sequence the
    targets and features of its own forward, and later reads run no forward."""
    base = load_base_model("tiny-llama", "none", "float32")
    rows = load_from_disk(str(teacher_dir.parent / "data" / "train"))
    alone, together = (OnlineTeacher(base.model, 16, keep_bytes=1e9) for _ in range(2))
    for teacher in (alone, together):
        teacher.runtime = None  # transformers, as on a GPU
        teacher.serve_features(aux_layers(base.model.config.num_hidden_layers))
    mine, theirs = alone.sequences(rows, "train"), together.sequences(rows, "train")
    assert len({len(s.input_ids) for s in theirs}) > 1  # padding is exercised
    together.prefetch(theirs)
    assert together.forwards == len(theirs)
    for one, many in zip(mine, theirs):
        assert torch.equal(one.topk_ids, many.topk_ids)
        assert torch.allclose(one.topk_logprobs.float(), many.topk_logprobs.float(), atol=2e-3)
        assert torch.allclose(one.features.float(), many.features.float(), atol=2e-2)
    assert together.forwards == len(theirs)  # every read was the prefetched result
    together.prefetch(theirs)
    assert together.forwards == len(theirs)  # nothing left to compute
