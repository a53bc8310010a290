"""The `ppdkit` command: its parser and `main` (logging, quiet libraries, one-line errors). The commands live by
what they do: cli_pipeline.py (run, demo, bench-insertion, bench-features, bench-online), cli_corpus.py (corpus grow,
show, adopt), cli_decoding.py (decode, serve, profile, bench) and cli_services.py (promote, submit, jobs, ui);
cli_errors.py finds a refused write in any error."""

import argparse
import logging
import os
import shlex
import sys

from .corpus_commands import add_corpus_commands
from .decode_commands import add_decoding_commands
from .errors import write_problem, write_problem_message
from .job_commands import add_pipeline_commands
from .kuberay_commands import add_kuberay_commands
from .serve_bench_commands import add_serve_bench_commands
from .service_commands import TORCH_FREE, add_service_commands

log = logging.getLogger("ppdkit")


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
    # MLflow's "View run ... at: URL" line when a run on a tracking server ends: the run summary gives its own links
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
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



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppdkit", description="Train, track and use Parallel Prompt Decoding drafts.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_pipeline_commands(sub)  # in the order `ppdkit --help` lists them
    add_corpus_commands(sub)
    add_decoding_commands(sub)
    add_service_commands(sub)
    add_kuberay_commands(sub)
    add_serve_bench_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ppdkit.jobs.ray_session import keep_local_ray_on_loopback

    keep_local_ray_on_loopback()  # before anything imports ray
    parser = build_parser()
    # Overrides may come after options (`run job.yaml --output D data.limit=8`): argparse leaves those over.
    args, extra = parser.parse_known_args(argv)
    args.command_line = shlex.join(["ppdkit", *(sys.argv[1:] if argv is None else argv)])  # what a report records
    # --verbose is the top parser's, but users put it after the command too (`ppdkit run job.yaml --verbose`)
    args.verbose = args.verbose or any(e in ("-v", "--verbose") for e in extra)
    extra = [e for e in extra if e not in ("-v", "--verbose")]
    if extra:
        if not hasattr(args, "overrides") or any("=" not in e or e.startswith("-") for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides += extra
    _setup_logging(args.verbose)
    _quiet_other_libraries(args.verbose)
    if not args.verbose and args.func not in TORCH_FREE:  # these never load torch: a second sooner
        _deepspeed_on_cpu_without_banner()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from ppdkit.jobs.pipeline import PipelineError
    from ppdkit.jobs.spec import SpecError
    from ppdkit.jobs.submit import JobFailed

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
        print(f"ppdkit: error: {write_problem_message(*problem, getattr(args, 'output_dir', None))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
