"""The pipeline: ordered stages, each writing `DIR/<stage>/` and a `summary.json` that marks it complete.

A stage whose summary exists and was made from the same inputs (its spec sections and every earlier
stage's inputs) is skipped, so a rerun after a crash resumes where it stopped. A stage made from other
inputs is never silently reused or overwritten: the error says what changed.

The summary is published last, in one rename, after the stage's figures and files reached the tracker:
a stage that failed (a full disk, a stopped tracking server, a killed driver) is never marked complete,
and `register`, the last stage, is the only one that touches the model registry.
"""

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ppdkit.data_pipeline.corpus import corpus_digest
from ppdkit.models.paths import write_json_atomic
from ppdkit.registry.tracking import DatasetRecord, Tracker, numeric_leaves
from ppdkit.trainer.config import trains_online

from ppdkit.cli.console import key_figure
from .key_figures import figure_prefix, registry_tags
from .spec import JobSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageContext:
    spec: JobSpec
    output: Path  # the pipeline's output directory
    stage_dir: Path  # output / stage name; may hold an interrupted attempt's files to resume from
    tracker: Tracker


@dataclass(frozen=True)
class Stage:
    name: str
    sections: tuple[str, ...]  # the spec sections its output depends on
    run: Callable[[StageContext], dict[str, Any]]  # returns the stage's figures
    uses_ray: bool = False  # runs Ray tasks, actors or Ray Train (the others run in the driver alone)
    # logs run-level records from the stage's figures (datasets, key figures) before the stage counts as done
    after: Callable[[StageContext, dict[str, Any]], None] | None = None


def _run_data(ctx: StageContext) -> dict[str, Any]:
    from ppdkit.data_pipeline.data_stage import run_data_stage

    return run_data_stage(ctx.spec.base_model, ctx.spec.data, ctx.stage_dir)


def _log_data_sets(ctx: StageContext, summary: dict[str, Any]) -> None:
    ctx.tracker.log_datasets([DatasetRecord(**d) for d in summary["datasets"]])


def _run_teacher(ctx: StageContext) -> dict[str, Any]:
    from ppdkit.data_pipeline.teacher_stage import run_teacher_stage

    # live figures while it runs (hours for a large regenerated set): positions and tokens per second, the ETA
    return run_teacher_stage(ctx.spec.base_model, ctx.spec.data, ctx.spec.teacher, ctx.output / "data", ctx.stage_dir,
                             progress=lambda figures, step: ctx.tracker.log_metrics(
                                 {f"teacher.progress.{k}": v for k, v in figures.items()}, step=step),
                             placement=ctx.spec.ray.placement)


def _run_train(ctx: StageContext) -> dict[str, Any]:
    from ppdkit.trainer.launch import run_training
    from ppdkit.trainer.training_methods import TRAINING_METHODS

    method = TRAINING_METHODS[ctx.spec.train.method]
    if method.searches:  # no weights to train: a search on Ray Tune exports the component
        result = method.runner()(ctx.spec.base_model, ctx.spec.train, ctx.output / "data", ctx.stage_dir, ctx.tracker.ref())
        for folder in ("component", "plots"):
            ctx.tracker.log_artifact(ctx.stage_dir / folder, folder)
        return result
    # the workers read local directories, whatever their working directory
    cfg = ctx.spec.train.model_copy(update={key: str(local_component(key, ctx.spec.train, ctx.tracker))
                                            for key in components_named(ctx.spec.train)})
    result = run_training(ctx.spec.base_model, cfg, ctx.output / "teacher", ctx.stage_dir, ctx.tracker.ref(),
                          online=_online(ctx) if trains_online(cfg) else None, placement=ctx.spec.ray.placement)
    for folder in ("component", "plots"):
        ctx.tracker.log_artifact(ctx.stage_dir / folder, folder)
    figures = {"steps": result["steps"], "first_loss": result["first_loss"], "final_loss": result["final_loss"],
               "best_step": result["best_step"], "peak_worker_rss_mb": result["peak_worker_rss_mb"],
               "trained_positions": result["trained_positions"], "positions_per_second": result["positions_per_second"],
               **{f"best_{k}": v for k, v in result["best"].items()}}
    return {**figures, "component": result["component"]}


COMPONENT_KEYS = {  # train keys that name a component, and what to give there
    "skip_from": "the component of a `train.method: layer-skip` run",
    "init_from": "the component of a run of the same train.method",
}


def components_named(cfg) -> list[str]:
    """The train keys of COMPONENT_KEYS that train.method's section has and `cfg` sets."""
    return [key for key in COMPONENT_KEYS if key in type(cfg).model_fields and getattr(cfg, key)]


def local_component(key: str, cfg, tracker: Tracker) -> Path:
    """train.`key` as the absolute directory of a readable component (a models:/ URI is downloaded from the run's
    registry); a clear error before any stage runs when it is missing or damaged."""
    from ppdkit.models.artifact import committed_named_as, read_component

    source = getattr(cfg, key)
    if source.startswith("models:/"):
        from ppdkit.registry.models import resolve

        return resolve(source, tracker.ref().uri)
    directory = Path(source).expanduser().resolve()
    if not (directory / "component.json").is_file():
        raise PipelineError(f"train.{key}={source}: no component there ({directory}/component.json is missing"
                            f"{committed_named_as(directory)}); give {COMPONENT_KEYS[key]} "
                            "(OUTPUT/calibrate/component, or a directory under ppdkit/models/components) or its "
                            "registry URI models:/NAME@ALIAS")
    read_component(directory)  # damaged files fail here, not in the train stage
    return directory


def _online(ctx: StageContext) -> dict[str, Any]:
    """What train.online's base reads in place of a teacher cache: the data stage's rows, the teacher's settings."""
    return {"data_dir": str(ctx.output / "data"), "compute_dtype": ctx.spec.teacher.compute_dtype,
            "top_k": ctx.spec.teacher.top_k}


def _run_calibrate(ctx: StageContext) -> dict[str, Any]:
    from ppdkit.models.artifact import add_files
    from ppdkit.trainer.calibrate import calibrate
    from ppdkit.trainer.training_methods import TRAINING_METHODS

    component = ctx.stage_dir / "component"  # the trained component plus its trees: what the decoder loads
    shutil.rmtree(component, ignore_errors=True)
    shutil.copytree(ctx.output / "train" / "component", component)
    if not TRAINING_METHODS[ctx.spec.train.method].calibrates:  # nothing to calibrate: passed on as trained
        ctx.tracker.log_artifact(component, "component")
        return {"component": str(component), "calibrated": 0}
    cfg = ctx.spec.calibrate
    result = calibrate(ctx.spec.base_model.name, ctx.output / "train" / "component", ctx.output / "teacher", cfg.sizes,
                       cfg.max_rank, cfg.sequences, cfg.groups_per_sequence, cfg.micro_batch,
                       online=_online(ctx) if trains_online(ctx.spec.train) else None)
    add_files(component, json_files={"trees": result})
    ngram_figures = _write_ngram_table(ctx, component) if cfg.ngram_branches and result["kind"] == "ppd" else {}
    # the whole directory again: component.json now lists (and checksums) the trees and the n-gram table
    ctx.tracker.log_artifact(component, "component")
    from ppdkit.runtime.trees.tree import DynamicTree
    from ppdkit.trainer.tree_plot import plot_tree

    pictures = ctx.stage_dir / "trees"
    pictures.mkdir(exist_ok=True)
    for size, tree in result["trees"].items():
        plot_tree(DynamicTree.from_json(tree) if result["kind"] == "ppd" else _one_state(tree),
                  pictures / f"tree_size{size}.png", f"tree of {size} input tokens")
    ctx.tracker.log_artifact(pictures, "trees")
    k = len(result["acceptance"])
    figures = {f"p_top1_d{d + 1}": result["acceptance"][d][0] for d in range(k)}
    figures.update({f"tau_size{size}": tree["tau"] for size, tree in result["trees"].items()})
    return {**figures, **ngram_figures, "insertions": result["insertions"], "dtype": result["dtype"],
            "component": str(component)}


def _one_state(tree: dict):
    """A draft-head tree as a one-state dynamic tree without prompt tokens, for its picture."""
    from ppdkit.runtime.trees.tree import DynamicTree, TreeState

    state = TreeState(tuple(tree["parents"]), tuple(tree["depths"]), tuple(tree["ranks"]), (0,) * len(tree["parents"]))
    return DynamicTree({1: state}, {1: tree["tau"] - 1.0}, {1: 1.0}, tree["tau"], tree["size"])


def _write_ngram_table(ctx: StageContext, component) -> dict[str, Any]:
    """The corpus n-gram table counted from the training text's assistant turns (the teacher cache's, or the data
    stage's rows where train.online left no cache), into the component."""
    from ppdkit.data_pipeline.ngram_cache import assistant_texts, build_ngram_table, data_stage_sequences
    from ppdkit.data_pipeline.teacher_cache import TeacherCache
    from ppdkit.models.artifact import write_ngrams

    cfg = ctx.spec.calibrate
    sequences = (data_stage_sequences(ctx.output / "data") if trains_online(ctx.spec.train)
                 else TeacherCache(ctx.output / "teacher").sequences("train"))
    table = build_ngram_table(assistant_texts(sequences), cfg.ngram_max_n, cfg.ngram_branches,
                              min_count=cfg.ngram_min_count)
    path = write_ngrams(component, table.to_tensors())
    return {"ngram_entries": len(table.entries), "ngram_bytes": path.stat().st_size}


def _run_evaluate(ctx: StageContext) -> dict[str, Any]:
    from ppdkit.bench.decoding import run_bench, write_report
    from ppdkit.bench.plot import plot_report

    cfg = ctx.spec.evaluate
    # what made the report, without the output directory's path (a machine path means nothing in the run)
    made_by = (f"ppdkit run, evaluate stage: train.method={ctx.spec.train.method} evaluate.prompts={cfg.prompts} "
               f"evaluate.limit={cfg.limit} evaluate.max_new_tokens={cfg.max_new_tokens}"
               + (f" evaluate.tree_size={cfg.tree_size}" if cfg.tree_size else ""))
    report = run_bench(str(ctx.output / "calibrate" / "component"), cfg.prompts, cfg.limit, cfg.max_new_tokens,
                       cfg.methods, tree_size=cfg.tree_size, dtype=cfg.dtype, command=made_by)
    write_report(report, ctx.stage_dir / "bench.json")
    ctx.tracker.log_artifact(ctx.stage_dir / "bench.json", "evaluate")
    ctx.tracker.log_artifact(plot_report(report, ctx.stage_dir / "bench.png"), "evaluate")
    figures: dict[str, Any] = {"tree_size": report["tree_size"]}
    for row in report["results"]:
        name = figure_prefix(row["method"])
        figures.update({f"{name}_tokens_per_s": row["tokens_per_s"], f"{name}_speedup": row["speedup_vs_hf_greedy"],
                        f"{name}_identical_to_greedy": row["identical_to_greedy"],
                        f"{name}_accepted_per_step": row["mean_accepted_per_step"],
                        f"{name}_rows_per_step": row["mean_rows_per_step"]})
        if row.get("why"):  # no tree size pays on this machine: it ran plain steps, and says why
            figures.update({f"{name}_ran": row["ran"], f"{name}_why": row["why"]})
    return figures


def _log_key_figures(ctx: StageContext, summary: dict[str, Any]) -> None:
    """The run's key figures (jobs/key_figures.py) and the benchmark prompts as its evaluation dataset."""
    from ppdkit.data_pipeline.dataset_info import prompts_record

    from ppdkit.bench.decoding import load_prompts
    from .key_figures import key_figures

    metrics, tags = key_figures(ctx.spec.train.decoding_methods(), summary)
    ctx.tracker.log_metrics(metrics)
    ctx.tracker.set_tags(tags)
    cfg = ctx.spec.evaluate  # the prompts run_bench decoded: the same source and limit
    ctx.tracker.log_datasets([DatasetRecord(**prompts_record(cfg.prompts, load_prompts(cfg.prompts, cfg.limit)))])


def _run_register(ctx: StageContext) -> dict[str, Any]:
    if ctx.tracker.run_id is None:
        log.warning("stage register: tracking is off (tracking.enabled=false), so there is no run to register")
        return {"registered": 0, "reason": "tracking disabled"}
    from ppdkit.registry.models import register_component
    from ppdkit.registry.pyfunc import save_pyfunc

    model = ctx.stage_dir / "model"  # the component as an MLflow pyfunc model: what the version's source holds
    shutil.rmtree(model, ignore_errors=True)
    save_pyfunc(ctx.output / "calibrate" / "component", model)
    exported = _export_for_servers(ctx, model)
    ctx.tracker.log_artifact(model, "model")
    train, calibrate, evaluate = (read_summary(ctx.output / s) for s in ("train", "calibrate", "evaluate"))
    tags = registry_tags(ctx.spec.train.method, ctx.spec.base_model.name, calibrate_fingerprint(ctx), train,
                         calibrate, evaluate)
    name = ctx.spec.tracking.registered_model or f"ppdkit-{Path(ctx.spec.base_model.name).name}"
    version = register_component(ctx.tracker.client, name, ctx.tracker.run_id, {**tags, **exported}, artifact="model")
    return {"registered": 1, "name": name, "version": int(version), "uri": f"models:/{name}/{version}", **exported}


def _export_for_servers(ctx: StageContext, model: Path) -> dict[str, str]:
    """An eagle3 draft also in the layout vLLM loads, beside the component in the registered model
    (`model/speculators`: `ppdkit export models:/NAME@ALIAS ...` or MLflow's download give it to a server);
    {"exported": layout} for the version's tags, {} when there is none."""
    if ctx.spec.train.method != "eagle3":
        return {}
    from ppdkit.models.artifact import ArtifactError
    from ppdkit.models.eagle3_export import export_eagle3

    try:
        export_eagle3(ctx.output / "calibrate" / "component", model / "speculators", "speculators")
    except ArtifactError as e:  # a base too shallow for vLLM's three hidden states: ppdkit's decoder still serves it
        log.warning("stage register: no speculators export beside the component: %s", e)
        return {}
    return {"exported": "speculators"}


def calibrate_fingerprint(ctx: StageContext) -> str:
    return json.loads((ctx.output / "calibrate" / "component" / "component.json").read_text())["base_model"]["fingerprint"]


STAGES: dict[str, Stage] = {  # every stage, in the order they run
    "data": Stage("data", ("base_model", "data"), _run_data, uses_ray=True, after=_log_data_sets),
    "teacher": Stage("teacher", ("teacher",), _run_teacher, uses_ray=True),
    "train": Stage("train", ("train",), _run_train, uses_ray=True),
    "calibrate": Stage("calibrate", ("calibrate",), _run_calibrate),
    "evaluate": Stage("evaluate", ("evaluate",), _run_evaluate, after=_log_key_figures),
    "register": Stage("register", ("tracking",), _run_register),
}
STAGE_ORDER: tuple[str, ...] = tuple(STAGES)


class PipelineError(RuntimeError):
    pass


def select_stages(names: list[str] | None) -> list[Stage]:
    if names is None:
        return list(STAGES.values())
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise PipelineError(f"unknown stage(s) {unknown}; the stages, in order: {', '.join(STAGE_ORDER)}")
    return [stage for name, stage in STAGES.items() if name in names]


def _unneeded_stages(spec: JobSpec) -> dict[str, str]:
    """Stages the training method has no use for, with why: a layer-skip search reads no teacher cache."""
    from ppdkit.trainer.training_methods import TRAINING_METHODS

    method = TRAINING_METHODS[spec.train.method]
    if trains_online(spec.train):
        return {"teacher": "train.online: the base computes the targets in the training step"}
    return {} if method.needs_teacher else {"teacher": f"train.method {method.name} reads no teacher cache"}


def stage_inputs(spec: JobSpec, stage: Stage) -> dict[str, Any]:
    """What a stage's output is made from: its sections and those of every stage before it."""
    upto = STAGE_ORDER[: STAGE_ORDER.index(stage.name) + 1]
    sections = sorted({s for name in upto for s in STAGES[name].sections})
    inputs = {name: (section := getattr(spec, name)).model_dump(mode="json", exclude=set(section.execution_only))
              for name in sections}
    if "data" in inputs and (digest := corpus_digest(spec.data.source, spec.base_model.name)):
        inputs["data"]["corpus_digest"] = digest  # a corpus that has grown since is another input
    return inputs


def _digest(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def made_from(summary: dict[str, Any] | None, spec: JobSpec, stage: Stage) -> bool:
    """A stage's summary says it was made from this spec's inputs. A setting ppdkit gained after the stage ran,
    left at its default, changed nothing it made: it is not counted; nor is one its section no longer has (before
    issue 55 every method's train section recorded every method's keys, those of others at their defaults)."""
    if summary is None:
        return False
    inputs, recorded = stage_inputs(spec, stage), summary.get("inputs", {})
    as_then = {name: {**_keys_dropped_since(spec, name, recorded.get(name, {})),
                      **{key: value for key, value in values.items()
                         if key in recorded.get(name, {}) or value != _default(spec, name, key)}}
               for name, values in inputs.items()}
    return summary.get("inputs_digest") in (_digest(inputs), _digest(as_then))


def _default(spec: JobSpec, section: str, key: str) -> Any:
    field = type(getattr(spec, section)).model_fields.get(key)
    return None if field is None else field.get_default(call_default_factory=True)


def _keys_dropped_since(spec: JobSpec, section: str, recorded: dict[str, Any]) -> dict[str, Any]:
    """The recorded keys of `section` that its class in this spec does not have: only train's lost keys, when each
    method's section became its own class (issue 55)."""
    if section != "train":
        return {}
    fields = type(spec.train).model_fields
    return {key: value for key, value in recorded.items() if key not in fields}


def _recorded_changes(spec: JobSpec, recorded: dict[str, Any], inputs: dict[str, Any]) -> str:
    """What differs between a stage's recorded inputs and this spec's, keys its sections no longer have left out."""
    still = {name: {k: v for k, v in values.items() if k not in _keys_dropped_since(spec, name, values)}
             for name, values in recorded.items()}
    return "; ".join(_changes(still, inputs)) or "unknown"


def _changes(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changes(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def read_summary(stage_dir: Path) -> dict[str, Any] | None:
    path = stage_dir / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _is_done(spec: JobSpec, stage: Stage, stage_dir: Path, force: bool) -> bool:
    summary = read_summary(stage_dir)
    if summary is None:
        return False
    if made_from(summary, spec, stage) and not force:
        return True
    if not force:
        changed = _recorded_changes(spec, summary.get("inputs", {}), stage_inputs(spec, stage))
        raise PipelineError(f"{stage_dir} was made from other inputs ({changed}). Use another --output, "
                            f"or --force to redo the stage(s) in place")
    return False


def link_reused_stages(spec: JobSpec, output: Path, source: Path) -> list[str]:
    """Link output/<stage> to source/<stage> for each complete stage of another run's output made from this spec's
    inputs, where output has none: one teacher cache, many trainings. Returns the linked stages' names."""
    if not (source / STAGE_ORDER[0]).is_dir():
        raise PipelineError(f"--reuse {source}: no stage outputs there (a `ppdkit run --output` directory has data/, "
                            f"teacher/, ...)")
    linked, refused = [], []
    for name in STAGE_ORDER:
        made, target = read_summary(source / name), output / name
        if made is not None and target.is_symlink() and target.resolve() == (source / name).resolve():
            linked.append(name)  # linked by an earlier start of the same command: rerunning it resumes
            continue
        if made is None or target.exists() or target.is_symlink():
            continue
        if not made_from(made, spec, STAGES[name]):
            inputs = stage_inputs(spec, STAGES[name])
            refused.append(f"{name} ({_recorded_changes(spec, made.get('inputs', {}), inputs)})")
            continue
        target.symlink_to((source / name).resolve(), target_is_directory=True)
        linked.append(name)
    if not linked:
        raise PipelineError(f"--reuse {source}: no complete stage there was made from this spec's inputs"
                            + (f": {', '.join(refused)}" if refused else ""))
    log.info("reused from %s: %s", source, ", ".join(linked))
    return linked


def _record_reused(ctx: StageContext, stage: Stage, summary: dict[str, Any]) -> None:
    """A linked stage's figures (and records, the data stage's datasets) go to this run too: its runs-table row shows
    what it was made from."""
    ctx.tracker.log_metrics(numeric_leaves({stage.name: {k: v for k, v in summary.items() if k != "inputs"}}))
    if stage.after is not None:
        stage.after(ctx, summary)


def _write_spec(path: Path, spec: JobSpec) -> None:
    tmp = path.with_name(path.name + ".tmp")  # a rename: never a half-written spec next to the outputs
    tmp.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    os.replace(tmp, path)


def _publish_summary(stage_dir: Path, summary: dict[str, Any], tracker: Tracker) -> None:
    """Log the stage's figures and summary, then mark it complete by renaming its summary.json into place.

    In that order, a failure to track (or to write) leaves the stage incomplete, and the rerun redoes
    the tracking instead of skipping a stage whose figures never reached the run.
    """
    pending = stage_dir / ".pending"  # the artifact keeps the name summary.json
    pending.mkdir(exist_ok=True)
    write_json_atomic(pending / "summary.json", summary)
    tracker.log_metrics(numeric_leaves({stage_dir.name: {k: v for k, v in summary.items() if k != "inputs"}}))
    tracker.log_artifact(pending / "summary.json", stage_dir.name)
    os.replace(pending / "summary.json", stage_dir / "summary.json")
    shutil.rmtree(pending, ignore_errors=True)


def run_pipeline(spec: JobSpec, output: Path, tracker: Tracker, stages: list[str] | None = None,
                 force: bool = False, start_ray: Callable[[], None] = lambda: None,
                 reuse: Path | None = None) -> dict[str, dict[str, Any]]:
    """Run the selected stages in order; returns {stage: summary}. `start_ray()` is called before each
    stage that uses Ray (ray_session.lazy_ray_session's): Ray starts only if a stage needs it. `reuse`: another
    run's output directory whose complete stages made from the same inputs are linked, not redone."""
    selected = select_stages(stages)
    output.mkdir(parents=True, exist_ok=True)
    for name in link_reused_stages(spec, output, reuse) if reuse is not None else []:
        _record_reused(StageContext(spec, output, output / name, tracker), STAGES[name], read_summary(output / name))
    _write_spec(output / "spec.yaml", spec)
    tracker.log_artifact(output / "spec.yaml")
    results: dict[str, dict[str, Any]] = {}
    unneeded = _unneeded_stages(spec)
    if any(s.name == "train" for s in selected):
        for key in components_named(spec.train):
            local_component(key, spec.train, tracker)
    for stage in selected:
        stage_dir = output / stage.name
        if stage.name in unneeded:
            log.info("stage %s: skipped, %s", stage.name, unneeded[stage.name])
            continue
        if _is_done(spec, stage, stage_dir, force):
            log.info("stage %s: complete in %s, skipped", stage.name, stage_dir)
            results[stage.name] = read_summary(stage_dir)
            continue
        earlier = [s for s in STAGE_ORDER[: STAGE_ORDER.index(stage.name)] if s not in unneeded]
        for name in earlier:
            if not made_from(read_summary(output / name), spec, STAGES[name]):
                raise PipelineError(f"stage {stage.name} needs stage {name} done for this spec first: "
                                    f"add it to --stages")
        if force and stage_dir.is_symlink():  # a reused stage is redone here, never in the run it was linked from
            stage_dir.unlink()
        elif force:
            shutil.rmtree(stage_dir, ignore_errors=True)
        # An interrupted attempt's files stay: a stage may resume from them (the teacher's shards do).
        (stage_dir / "summary.json").unlink(missing_ok=True)
        stage_dir.mkdir(parents=True, exist_ok=True)
        if stage.uses_ray:
            start_ray()
        log.info("stage %s: running", stage.name)
        started = time.time()
        ctx = StageContext(spec, output, stage_dir, tracker)
        summary = stage.run(ctx)
        if stage.after is not None:
            stage.after(ctx, summary)
        inputs = stage_inputs(spec, stage)
        summary.update(stage=stage.name, seconds=round(time.time() - started, 2),
                       inputs=inputs, inputs_digest=_digest(inputs))
        _publish_summary(stage_dir, summary, tracker)
        figure = key_figure(stage.name, summary)
        log.info("stage %s: done in %.1f s%s", stage.name, summary["seconds"], f": {figure}" if figure else "")
        results[stage.name] = summary
    return results
