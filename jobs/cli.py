"""The `ppdkit` command."""

import argparse
import errno
import logging
import os
import sys
from importlib import resources
from pathlib import Path

from ppdkit.runtime.methods import METHODS as DECODING_METHODS

log = logging.getLogger("ppdkit")
LOOKUP_CHAINS_HELP = ("ppd-lookup: chains per step, the context's then the component's n-gram table's "
                      "(default 1: extra rows cost more than they gain on a small CPU)")


def demo_spec_path() -> Path:
    return Path(str(resources.files("ppdkit.jobs.configs").joinpath("demo.yaml")))


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "filelock", "alembic", "mlflow.store"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _quiet_other_libraries(verbose: bool) -> None:
    """Other libraries' progress bars ("Loading weights" at every model load) off unless --verbose, in this
    process and in the Ray workers it starts (they inherit the environment); our own bars stay."""
    if verbose:
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' bars
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # datasets' (saving, mapping)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # "Downloading artifacts" (models:/)
    # Ray's warning at every local start that token authentication is on (its default, which stays on)
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    if "transformers" in sys.modules:  # already imported (a caller's process): its switch was read at import
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()


def _deepspeed_on_cpu_without_banner() -> None:
    """DS_ACCELERATOR=cpu where torch finds no GPU: what DeepSpeed would find out itself, with a banner at every
    import (loading a model imports it too), in this process and the Ray workers it starts."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


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

    from .pipeline import run_pipeline
    from .ray_session import lazy_ray_session
    from .console import print_run_summary, show_sample
    from .spec import flatten, load_spec, run_tags

    spec = load_spec(args.spec, args.overrides)
    output = Path(args.output) if args.output else _default_output(spec.name)
    args.output_dir = output  # named by the error when it cannot be written
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    log.info("job %s -> %s", spec.name, output)
    _check_writable(output)
    tracker = start_tracker(spec.tracking, run_name=spec.name, run_file=output / "run.json")
    tracker.log_params(flatten(spec))
    tracker.set_tags(run_tags(spec))
    try:
        # the workers' output stays in Ray's logs and the stages' log files unless --verbose: this terminal
        # shows our own lines and one bar per long loop
        with lazy_ray_session(spec.ray, log_to_driver=args.verbose) as start_ray:
            results = run_pipeline(spec, output, tracker, stages=stages, force=args.force, start_ray=start_ray)
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


def cmd_bench_insertion(args: argparse.Namespace) -> int:
    import json

    from ppdkit.trainer.bench import insertion_benchmark

    from .spec import load_spec

    spec = load_spec(args.spec, args.overrides)
    output = Path(args.output) if args.output else _default_output(spec.name)
    if not (output / "teacher" / "manifest.json").is_file():
        raise FileNotFoundError(f"{output}/teacher has no teacher cache: first run "
                                f"`ppdkit run {args.spec} --stages data,teacher --output {output}`")
    report = insertion_benchmark(spec.base_model, spec.train, output / "teacher", batches=args.batches,
                                 threads=args.threads)
    print(f"\n{'mode':<32} {'positions':>10} {'seconds':>9} {'positions/s':>12}")
    for row in report["results"]:
        print(f"{row['mode']:<32} {row['positions']:>10} {row['seconds']:>9.2f} {row['positions_per_second']:>12.1f}")
    print(f"multi-insertion speedup: {report['speedup']:.2f}x (same sequences, same process)")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from ppdkit.registry.models import client, promote

    print(promote(client(args.tracking_uri), args.name, args.version, force=args.force))
    return 0


def _skip_map(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a skip map is comma-separated integers 0-3, one per layer, not {text!r}")


def _decoder(args: argparse.Namespace):
    """The decoder of --base (with --skip-map) or --model (with decode's and serve's loading options)."""
    from ppdkit.runtime.decoder import Decoder

    if args.base:
        return Decoder.from_base(args.base, skip_map=args.skip_map, device=args.device)
    return Decoder.from_pretrained(args.model, tree_size=args.tree_size, lookup_chains=args.lookup_chains,
                                   dynamic_size=args.dynamic_size, early_head=args.early_head,
                                   prune_top_k=args.prune_top_k, device=args.device)


def cmd_decode(args: argparse.Namespace) -> int:
    from .console import text_streamer

    decoder = _decoder(args)
    result = decoder.generate(args.prompt, args.max_new_tokens, args.method, stream=text_streamer(decoder.tokenizer),
                              temperature=args.temperature, acceptance=args.acceptance, epsilon=args.epsilon,
                              delta=args.delta, seed=args.seed)
    rows = result.rows_per_step
    fed = f", {sum(rows) / len(rows):.1f} inputs per step (at most {max(rows)})" if rows else ""
    ran = f" (auto ran {result.method})" if args.method != result.method else ""
    print(f"\n\n[{args.method}]{ran} {len(result.tokens)} tokens in {result.seconds:.2f} s "
          f"({len(result.tokens) / result.seconds:.1f} tok/s), {result.steps} steps, "
          f"{result.mean_accepted_per_step:.2f} tokens per step{fed}", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import ServeLimits, serve

    decoder = _decoder(args)
    if args.method not in decoder.methods():
        raise ValueError(f"--method {args.method} is not one this decoder serves; use one of "
                         f"{', '.join(decoder.methods())}")
    serve(decoder, args.name or args.model or args.base, args.host, args.port, args.method,
          ServeLimits(args.max_tokens, args.max_request_bytes, args.max_waiting))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from ppdkit.runtime.decoder import Decoder

    decoder = Decoder.from_pretrained(args.model, tree_size=None, device=args.device)
    if args.refresh:
        from ppdkit.runtime.profile import profile_trees

        decoder.profile = profile_trees(decoder.model, {int(r["size"]): r["tau"] for r in decoder.profile["rows"]},
                                        decoder.fingerprint, refresh=True, **decoder.profile_drafter())
    if decoder.profile is None:
        raise ValueError(f"{args.model} has no trees.json: run the calibrate stage first")
    p = decoder.profile
    print(f"machine {p['machine']}, context {p['context']} tokens, one-token forward {p['one_token_ms']:.1f} ms")
    print(f"{'size':>5} {'tau':>6} {'latency ms':>11} {'of it draft':>11} {'tokens/s':>9} {'x one-token':>11}")
    for r in p["rows"]:
        mark = "  <- chosen" if r["size"] == p["chosen"] else ""
        print(f"{r['size']:>5} {r['tau']:>6.2f} {r['latency_ms']:>11.1f} {r.get('draft_ms', 0.0):>11.1f} "
              f"{r['tokens_per_s']:>9.1f} {r['speedup_vs_one_token']:>11.2f}{mark}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import print_table, run_bench, write_report

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    report = run_bench(args.model or args.base, args.prompts, args.limit, args.max_new_tokens, methods,
                       args.tree_size, args.lookup_chains, args.early_head, args.prune_top_k, base_only=bool(args.base),
                       skip_map=args.skip_map, device=args.device, repeats=args.repeats)
    print_table(report)
    if args.out:
        write_report(report, Path(args.out))
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from . import submit as ray_jobs
    from .spec import load_spec

    spec = load_spec(args.spec, args.overrides)  # a bad spec fails here, not on the cluster
    env = {k: os.environ[k] for k in ("MLFLOW_TRACKING_URI", "PPDKIT_CACHE", "RAY_AUTH_MODE") if k in os.environ}
    job_id = ray_jobs.submit(spec, args.address, args.output, args.python, env)
    print(job_id)
    if args.wait:
        print(ray_jobs.wait(args.address, job_id), file=sys.stderr)
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from . import submit as ray_jobs

    if args.action == "list":
        for row in ray_jobs.list_jobs(args.address):
            print(f"{row['id']:<28} {row['status']:<10} {row['name']:<16} {row['entrypoint']}")
        return 0
    if not args.job_id:
        raise ValueError(f"`ppdkit jobs {args.action}` needs a job id (see `ppdkit jobs list`)")
    if args.action == "status":
        print(ray_jobs.status(args.address, args.job_id))
    elif args.action == "logs":
        ray_jobs.logs(args.address, args.job_id, args.follow)
    elif args.action == "stop":
        print("stopped" if ray_jobs.stop(args.address, args.job_id) else "already finished")
    return 0


TRAINING_VIEW = "workflowType=machine_learning"  # the MLflow UI's "Model training" pages, by URL


def cmd_ui(args: argparse.Namespace) -> int:
    from ppdkit.registry.tracking import default_tracking_uri

    uri = args.tracking_uri or default_tracking_uri()
    # this interpreter's mlflow: `.venv/bin/ppdkit ui` works with the venv not activated (no mlflow on PATH)
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host, "--port",
           str(args.port)]
    print("running:", " ".join(cmd))
    # MLflow 3's UI opens on its GenAI pages unless the browser chose otherwise: this address opens the runs
    print(f"open http://{args.host}:{args.port}/#/experiments?{TRAINING_VIEW} for the runs, their charts and "
          "the model registry", flush=True)
    os.execv(cmd[0], cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppdkit", description="Train, track and use Parallel Prompt Decoding drafts.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add_run_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("overrides", nargs="*", metavar="key=value", help="spec overrides, e.g. data.limit=64")
        p.add_argument("--output", help="output directory (default: the cache's runs/<job name>)")
        p.add_argument("--stages", help="comma-separated stages to run (default: all available), e.g. data,teacher")
        p.add_argument("--force", action="store_true", help="redo selected stages even if their output is complete")

    run = sub.add_parser("run", help="run a job spec's pipeline on an embedded local Ray (or ray.address)")
    run.add_argument("spec", help="job spec YAML")
    add_run_args(run)
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="run the demo job (jobs/configs/demo.yaml) end to end")
    add_run_args(demo)
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench-insertion", help="training throughput: multi-insertion vs one insertion per sequence")
    bench.add_argument("spec", help="job spec YAML (its base_model and train sections are used)")
    bench.add_argument("overrides", nargs="*", metavar="key=value")
    bench.add_argument("--output", help="the job's output directory, holding teacher/ (default: the cache's runs/<name>)")
    bench.add_argument("--batches", type=int, default=4)
    bench.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    bench.add_argument("--out", help="write the report as JSON here")
    bench.set_defaults(func=cmd_bench_insertion)

    decode = sub.add_parser("decode", help="decode a prompt with a component (greedy or sampled, lossless), streaming")
    decode.add_argument("--prompt", required=True)
    decode.add_argument("--max-new-tokens", type=int, default=128)
    decode.add_argument("--method", default="ppd", choices=list(DECODING_METHODS))
    decode.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); above 0: sampled")
    decode.add_argument("--acceptance", default="speculative", choices=["speculative", "typical"],
                        help="sampled decoding: speculative keeps the model's distribution exactly; typical "
                             "(--epsilon, --delta) accepts more guesses")
    decode.add_argument("--epsilon", type=float, default=0.09)
    decode.add_argument("--delta", type=float, default=0.3)
    decode.add_argument("--seed", type=int, help="fixes the draws of sampled decoding")
    decode.set_defaults(func=cmd_decode)

    serve_cmd = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, "
                                             "streaming; /health, /metrics) for a component or a base model")
    serve_cmd.add_argument("--method", default="auto", choices=list(DECODING_METHODS),
                           help="the decoding method of requests that name none (a request's `method` field)")
    serve_cmd.add_argument("--host", default="127.0.0.1", help="the address to bind (default: this machine only)")
    serve_cmd.add_argument("--port", type=int, default=8000)
    serve_cmd.add_argument("--name", help="the model id clients see (default: --model or --base as given)")
    serve_cmd.add_argument("--max-tokens", type=int, default=1024, help="the most new tokens a request may ask for")
    serve_cmd.add_argument("--max-request-bytes", type=int, default=1_000_000)
    serve_cmd.add_argument("--max-waiting", type=int, default=16, help="requests queued behind the one decoding "
                                                                       "(more get 503)")
    for parser_ in (decode, serve_cmd):
        parser_.add_argument("--tree-size", type=int, help="default: the size profiled as fastest on this machine")
        parser_.add_argument("--dynamic-size", action="store_true",
                             help="pick the tree size per step from measured step times and acceptance (ProPD 4.2)")
        parser_.add_argument("--lookup-chains", type=int, default=1, help=LOOKUP_CHAINS_HELP)
    serve_cmd.set_defaults(func=cmd_serve)

    prof = sub.add_parser("profile", help="measure forward latency per tree size here; print tau/L and the choice")
    prof.add_argument("--model", required=True)
    prof.add_argument("--refresh", action="store_true", help="measure again instead of using the cached profile")
    prof.add_argument("--device", default="cpu", help="the torch device to profile (cpu, cuda, cuda:N, mps)")
    prof.set_defaults(func=cmd_profile)

    bench_dec = sub.add_parser("bench", help="decoding benchmark: methods on the same prompts, one process")
    bench_dec.add_argument("--prompts", default="mt-bench", help="mt-bench | humaneval | FILE.jsonl")
    bench_dec.add_argument("--limit", type=int, default=10)
    bench_dec.add_argument("--max-new-tokens", type=int, default=128)
    bench_dec.add_argument("--methods", default="hf-greedy,hf-pld,ar,ppd,ppd-lookup",
                           help="comma-separated; a tree method with +dyn picks its tree size per step, e.g. ppd+dyn")
    bench_dec.add_argument("--tree-size", type=int)
    bench_dec.add_argument("--lookup-chains", type=int, default=1, help=LOOKUP_CHAINS_HELP)
    bench_dec.add_argument("--repeats", type=int, default=1,
                           help="decode every prompt this many times per method, in turns, and count the fastest "
                                "run (steadier ratios on a busy or drifting machine)")
    bench_dec.add_argument("--out", help="write the report as JSON here")
    for parser_ in (decode, bench_dec, serve_cmd):
        source = parser_.add_mutually_exclusive_group(required=True)
        source.add_argument("--model", help="a component: its directory (e.g. OUTPUT/calibrate/component) or "
                                            "models:/NAME@ALIAS")
        source.add_argument("--base", help="a base model alone (smollm2-135m, tiny-llama or a local directory), for "
                                           "the methods that need no component: ar, anpd, self-draft, auto, and skip "
                                           "with --skip-map")
        parser_.add_argument("--skip-map", type=_skip_map, help="with --base, for --method skip: per decoder layer "
                                                                "0 keep, 1 skip the attention, 2 the MLP, 3 both, "
                                                                "comma-separated (e.g. 0,0,3,1,...)")
        parser_.add_argument("--early-head", help="an early-head component (train.method early-head) for the *-prune "
                                                  "methods")
        parser_.add_argument("--prune-top-k", type=int, default=8,
                             help="early pruning keeps a node whose token is among its parent's K early guesses")
        parser_.add_argument("--device", default="cpu",
                             help="where the model runs: cpu (default; the native kernels), cuda, cuda:N or mps "
                                  "(the PyTorch layers; not run on a GPU by our tests, see the README)")
    bench_dec.set_defaults(func=cmd_bench)

    prom = sub.add_parser("promote", help="move the champion alias to a registered version if it is at least as good")
    prom.add_argument("name")
    prom.add_argument("version")
    prom.add_argument("--force", action="store_true", help="promote even if it is worse than the champion")
    prom.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else the cache's sqlite store")
    prom.set_defaults(func=cmd_promote)

    sub_job = sub.add_parser("submit", help="submit a job spec's whole pipeline to a Ray cluster as a Ray job")
    sub_job.add_argument("spec")
    sub_job.add_argument("overrides", nargs="*", metavar="key=value")
    sub_job.add_argument("--address", required=True, help="the cluster's job API, e.g. http://127.0.0.1:8265")
    sub_job.add_argument("--output", help="output directory on the cluster (default: its cache's runs/<name>)")
    sub_job.add_argument("--python", help="interpreter on the cluster (default: this one for a local head, else python)")
    sub_job.add_argument("--wait", action="store_true", help="wait for the job to end; fail with its last log lines")
    sub_job.set_defaults(func=cmd_submit)

    jobs_cmd = sub.add_parser("jobs", help="Ray jobs on a cluster: list | status ID | logs ID [--follow] | stop ID")
    jobs_cmd.add_argument("action", choices=["list", "status", "logs", "stop"])
    jobs_cmd.add_argument("job_id", nargs="?")
    jobs_cmd.add_argument("--address", default=os.environ.get("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:8265"))
    jobs_cmd.add_argument("--follow", action="store_true")
    jobs_cmd.set_defaults(func=cmd_jobs)

    ui = sub.add_parser("ui", help="open the MLflow UI on the local tracking store (127.0.0.1)")
    ui.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else the cache's sqlite store")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(func=cmd_ui)
    return parser


# A file system that refuses writes, and what to do about it. (Root ignores file permissions, so for
# root EACCES comes from mount options or special file systems; for others, from permissions.)
WRITE_PROBLEMS = {
    errno.ENOSPC: "Free space there or choose another --output",
    errno.EDQUOT: "Free space within your quota or choose another --output",
    errno.EROFS: "Choose an --output on a writable file system",
    errno.EACCES: "Choose an --output you may write to, or change its permissions",
}
# Writers that report the OS error only in their message (safetensors, Arrow): these phrases are
# specific enough to recognise there; "Permission denied" is not.
WRITE_PROBLEM_TEXTS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def write_problem(exc: BaseException) -> tuple[int, str | None] | None:
    """(errno, path or None) when `exc`, or an error it wraps, is a refused write (full, read-only,
    forbidden). Ray task and Ray Train errors carry the worker's exception."""
    chain, stack = [], [exc]
    while stack:
        e = stack.pop()
        if e is None or any(e is seen for seen in chain):
            continue
        chain.append(e)
        stack += [e.__cause__, e.__context__, getattr(e, "cause", None), getattr(e, "controller_failure", None)]
        stack += list((getattr(e, "worker_failures", None) or {}).values())  # Ray Train: {rank: exception}
    for e in chain:  # an OSError first: it names the file
        if isinstance(e, OSError) and e.errno in WRITE_PROBLEMS:
            return e.errno, e.filename
    for e in chain:
        for code in WRITE_PROBLEM_TEXTS:
            if os.strerror(code) in str(e):
                return code, None
    return None


def _write_problem_message(code: int, path: str | None, output: Path | None) -> str:
    if output is not None and (path is None or Path(path).resolve().is_relative_to(output.resolve())):
        where = f"the output directory {output}"
    else:  # not the output (e.g. the cache), or a command without one
        where = f"{Path(path).parent}" if path else "a directory ppdkit writes to"
    writing = f" (writing {path})" if path and (output is None or Path(path) != output) else ""
    return (f"{where}: {os.strerror(code)}{writing}. {WRITE_PROBLEMS[code]}, then rerun the same command: "
            "finished stages are kept")


def main(argv: list[str] | None = None) -> int:
    from .ray_session import keep_local_ray_on_loopback

    keep_local_ray_on_loopback()  # before anything imports ray
    parser = build_parser()
    # Overrides may come after options (`run job.yaml --output D data.limit=8`): argparse leaves those over.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any("=" not in e or e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides += extra
    _setup_logging(args.verbose)
    _quiet_other_libraries(args.verbose)
    if not args.verbose and args.func not in (cmd_submit, cmd_jobs, cmd_ui):  # these never load torch: a second sooner
        _deepspeed_on_cpu_without_banner()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from .pipeline import PipelineError
    from .spec import SpecError
    from .submit import JobFailed

    try:
        return args.func(args)
    except (SpecError, PipelineError, ConnectionError, FileNotFoundError, ValueError, JobFailed,
            TimeoutError) as e:  # RegistryError is a ValueError; TrackingUnavailable a ConnectionError
        print(f"ppdkit: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        # A full or read-only disk surfaces deep inside a stage (or a Ray worker): say which directory and
        # what to do in one line, not with a traceback from wherever the write happened.
        problem = write_problem(e)
        if problem is None:
            raise
        log.debug("the refused write", exc_info=True)
        print(f"ppdkit: error: {_write_problem_message(*problem, getattr(args, 'output_dir', None))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
