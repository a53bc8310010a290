"""The pipeline commands: `ppdkit run` (a job spec's stages on an embedded or given Ray), `demo` (the packaged demo
job, end to end), `bench-insertion` and `bench-features` (training throughput)."""

import argparse
import logging
from importlib import resources
from pathlib import Path

log = logging.getLogger("ppdkit")


def demo_spec_path() -> Path:
    return Path(str(resources.files("ppdkit.jobs.configs").joinpath("demo.yaml")))


def _default_output(name: str) -> Path:
    from ppdkit.models.paths import cache_dir

    return cache_dir() / "runs" / name


def _check_writable(output: Path) -> None:
    """A read-only or forbidden output fails here, before a tracking run or Ray is started for nothing."""
    import tempfile

    try:
        output.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output):
            pass
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(output)) from None


def cmd_run(args: argparse.Namespace) -> int:
    from ppdkit.registry.tracking import start_tracker

    from ppdkit.jobs.pipeline import run_pipeline, select_stages
    from ppdkit.jobs.ray_session import lazy_ray_session
    from .console import print_run_summary, show_sample
    from ppdkit.jobs.spec import flatten, load_spec, run_tags

    spec = load_spec(args.spec, args.overrides)
    output = Path(args.output) if args.output else _default_output(spec.name)
    args.output_dir = output  # named by the error when it cannot be written
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    select_stages(stages)  # a misspelled stage fails here, before an MLflow run is started (and left FAILED)
    log.info("job %s -> %s", spec.name, output)
    _check_writable(output)
    tracker = start_tracker(spec.tracking, run_name=spec.name, run_file=output / "run.json")
    tracker.log_params(flatten(spec))
    tracker.set_tags(run_tags(spec))
    try:
        # the workers' output stays in Ray's logs and the stages' log files unless --verbose: this terminal
        # shows our own lines and one bar per long loop
        with lazy_ray_session(spec.ray, log_to_driver=args.verbose) as start_ray:
            results = run_pipeline(spec, output, tracker, stages=stages, force=args.force, start_ray=start_ray,
                                   reuse=Path(args.reuse) if args.reuse else None)
    except BaseException:
        tracker.finish("FAILED")
        raise
    tracker.finish("FINISHED")
    print_run_summary(spec, output, results, tracker)
    if getattr(args, "show_sample", False) and "evaluate" in results:
        show_sample(output, spec, results["evaluate"])
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    args.spec = str(demo_spec_path())
    args.show_sample = True
    return cmd_run(args)


def _training_benchmark(args: argparse.Namespace, benchmark, what: str, stage: str = "teacher") -> dict:
    """Run a training-throughput benchmark on the job's teacher cache (or data stage); print its table and write its
    report. `benchmark(spec, stage directory, batches=, threads=)`."""
    import json

    from ppdkit.jobs.spec import load_spec

    spec = load_spec(args.spec, args.overrides)
    output = Path(args.output) if args.output else _default_output(spec.name)
    if not (output / stage / ("manifest.json" if stage == "teacher" else "train")).exists():
        raise FileNotFoundError(f"{output}/{stage} is not there: first run "
                                f"`ppdkit run {args.spec} --stages {'data,teacher' if stage == 'teacher' else 'data'} "
                                f"--output {output}`")
    report = benchmark(spec, output / stage, batches=args.batches, threads=args.threads)
    print(f"\n{'mode':<32} {'positions':>10} {'seconds':>9} {'positions/s':>12}")
    for row in report["results"]:
        print(f"{row['mode']:<32} {row['positions']:>10} {row['seconds']:>9.2f} {row['positions_per_second']:>12.1f}")
    print(f"{what}: {report['speedup']:.2f}x (same sequences, same process)")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return report


def cmd_bench_insertion(args: argparse.Namespace) -> int:
    from ppdkit.bench.prompt_training import insertion_benchmark

    _training_benchmark(args, lambda spec, cache, **kw: insertion_benchmark(spec.base_model, spec.train, cache, **kw),
                        "multi-insertion speedup")
    return 0


def cmd_bench_features(args: argparse.Namespace) -> int:
    from ppdkit.bench.head_features import features_benchmark

    report = _training_benchmark(args, lambda spec, cache, **kw: features_benchmark(spec.base_model, spec.train, cache,
                                                                                 **kw), "kept features speedup")
    print(f"feature cache: {report['feature_bytes'] / 1e9:.2f} GB, {report['feature_bytes_per_position']:.0f} bytes "
          f"per position ({report['compute_dtype']} teacher, float16 on disk)")
    return 0


def cmd_bench_online(args: argparse.Namespace) -> int:
    from ppdkit.bench.eagle3_online import online_benchmark

    _training_benchmark(args, lambda spec, data, **kw: online_benchmark(spec.base_model, spec.train, spec.teacher, data,
                                                                        **kw), "precomputed against online", "data")
    return 0


def add_pipeline_commands(sub: argparse._SubParsersAction) -> None:
    """run, demo, bench-insertion, bench-features and bench-online."""

    def add_run_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("overrides", nargs="*", metavar="key=value", help="spec overrides, e.g. data.limit=64")
        p.add_argument("--output", help="output directory (default: the cache's runs/<job name>)")
        p.add_argument("--stages", help="comma-separated stages to run (default: all available), e.g. data,teacher")
        p.add_argument("--force", action="store_true", help="redo selected stages even if their output is complete")
        p.add_argument("--reuse", metavar="RUN_DIR", help="link the complete stages of another run's output made from "
                                                          "the same inputs (e.g. its data and teacher cache) instead of "
                                                          "redoing them")

    run = sub.add_parser("run", help="run a job spec's pipeline on an embedded local Ray (or ray.address)")
    run.add_argument("spec", help="job spec YAML")
    add_run_args(run)
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="run the demo job (ppdkit/jobs/configs/demo.yaml) end to end")
    add_run_args(demo)
    demo.set_defaults(func=cmd_demo)

    for name, func, what in (
            ("bench-insertion", cmd_bench_insertion, "training throughput: multi-insertion vs one insertion per sequence"),
            ("bench-features", cmd_bench_features, "head-training throughput: features kept in the teacher cache vs "
                                                   "computed by the base model"),
            ("bench-online", cmd_bench_online, "EAGLE-3 training throughput: targets and states precomputed (a "
                                               "teacher cache) vs computed by the base in the step (train.online)")):
        bench = sub.add_parser(name, help=what)
        bench.add_argument("spec", help="job spec YAML (its base_model and train sections are used)")
        bench.add_argument("overrides", nargs="*", metavar="key=value")
        bench.add_argument("--output", help="the job's output directory, holding teacher/ (bench-online: data/; "
                                            "default: the cache's runs/<name>)")
        bench.add_argument("--batches", type=int, default=4)
        bench.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
        bench.add_argument("--out", help="write the report as JSON here")
        bench.set_defaults(func=func)
