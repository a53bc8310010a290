"""`ppdkit serve-bench`: `ppdkit serve` and its peers (vLLM-CPU and llama.cpp's llama-server, each with and without
ppdkit's EAGLE-3 draft) under the same concurrent clients, one server after another (ppdkit/bench/serving_load.py)."""

import argparse
import logging
import os
import tempfile
from pathlib import Path

from ppdkit.models.gguf_export import OUTTYPES

log = logging.getLogger("ppdkit")

DEFAULT_SERVERS = "ppdkit,vllm,vllm-eagle3,llama.cpp,llama.cpp-eagle3"


def _clients(text: str) -> list[int]:
    from ppdkit.bench.serving_load import parse_clients

    try:
        return parse_clients(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _servers(text: str) -> list[str]:
    from ppdkit.bench.serving_backends import check_kinds

    kinds = [k.strip() for k in text.split(",") if k.strip()]
    try:
        check_kinds(kinds)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return list(dict.fromkeys(kinds))


def _port(text: str) -> int:
    port = int(text) if text.isdigit() else -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 (pick a free one) or 1-65535, not {text!r}")
    return port


def cmd_serve_bench(args: argparse.Namespace) -> int:
    from ppdkit.bench.decoding import load_prompts
    from ppdkit.bench.serving_backends import ServeBenchSettings, base_name, check_port_free
    from ppdkit.bench.serving_load import print_table, run_serve_bench, write_report

    if args.port:
        check_port_free(args.port)  # before a prompt is read or a server started
    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.model:  # a --model that is no component is refused here too, before any server starts
        base_name(ServeBenchSettings(source=args.model, base_only=False))
    prompts = load_prompts(args.prompts, args.limit)
    with tempfile.TemporaryDirectory(prefix="ppdkit-serve-bench-") as scratch:
        work = Path(args.logs) if args.logs else Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        settings = ServeBenchSettings(
            source=args.model or args.base, base_only=bool(args.base), method=args.method, dtype=args.dtype,
            draft=args.draft, speculative_tokens=args.num_speculative_tokens, draft_outtype=args.draft_outtype,
            vllm_dtype=args.vllm_dtype,
            threads=args.threads, max_clients=max(args.clients), max_tokens=args.max_tokens,
            **({"vllm_python": Path(args.vllm_python)} if args.vllm_python else {}),
            llama_server=Path(args.llama_server) if args.llama_server else None, work=work)
        report = run_serve_bench(args.servers, settings, prompts, args.prompts, args.clients, args.port,
                                 args.startup_timeout, args.command_line)
    print_table(report)
    if args.out:
        write_report(report, Path(args.out))
        print(f"report: {args.out}")
    if args.plot and any(s["status"] == "ran" for s in report["servers"]):
        from ppdkit.bench.serving_plot import plot_serving

        print(f"plot: {plot_serving(report, Path(args.plot))}")
    return 1 if any(s["status"] == "failed" for s in report["servers"]) else 0


def add_serve_bench_commands(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("serve-bench", help="ppdkit serve, vLLM-CPU (plain and with the EAGLE-3 draft) and llama.cpp's "
                                               "llama-server under the same concurrent clients: tokens/s, latency, "
                                               "memory, identical answers")
    source = bench.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="the component `ppdkit serve` loads (directory or models:/NAME@ALIAS); the "
                                        "peers serve its base model")
    source.add_argument("--base", help="a base model alone for `ppdkit serve` and the peers (smollm2-135m, ...)")
    bench.add_argument("--method", default="auto", help="ppdkit serve's --method (default auto)")
    bench.add_argument("--dtype", default="auto", help="ppdkit serve's --dtype (default auto)")
    bench.add_argument("--servers", type=_servers, default=_servers(DEFAULT_SERVERS),
                       help=f"comma-separated, run in this order (default {DEFAULT_SERVERS})")
    bench.add_argument("--clients", type=_clients, default=_clients("1,4,16,64"),
                       help="the concurrency levels, comma-separated (default 1,4,16,64; 1 always runs, first: its "
                            "answers are the reference)")
    bench.add_argument("--prompts", default="mt-bench", help="mt-bench | humaneval | FILE.jsonl (first turns)")
    bench.add_argument("--limit", type=int, default=16, help="prompts (default 16); a level of N clients sends "
                                                             "max(prompts, N) requests, the prompts in turn")
    bench.add_argument("--max-tokens", type=int, default=128, help="max_tokens of every request (default 128)")
    bench.add_argument("--draft", help="vllm-eagle3's and llama.cpp-eagle3's draft, an eagle3 component (default: "
                                       "--model where it is one, else the committed smollm2-135m-eagle3), exported as "
                                       "`ppdkit export --format speculators` or `--format gguf` does")
    bench.add_argument("--num-speculative-tokens", type=int, default=3,
                       help="vllm-eagle3's draft tokens per step, llama.cpp-eagle3's most (--spec-draft-n-max)")
    bench.add_argument("--draft-outtype", default="auto", choices=OUTTYPES,
                       help="llama.cpp-eagle3's draft matrices in its GGUF, as `ppdkit export --outtype` "
                            "(default auto: f16)")
    bench.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float32"],
                       help="vLLM's weights (default bfloat16)")
    bench.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server's -t and -tb "
                                                                                "(default: every core)")
    bench.add_argument("--vllm-python", help="the python of a venv with vllm-cpu (default: .venv-vllm's, from `make "
                                             "setup-vllm`)")
    bench.add_argument("--llama-server", help="a llama-server binary (default: the one `make setup-llama-server` "
                                              "built, else llama-server on PATH)")
    bench.add_argument("--port", type=_port, default=0, help="the port each server listens on in turn (default 0: a "
                                                             "free one)")
    bench.add_argument("--startup-timeout", type=float, default=900.0, help="seconds a server may take to get ready")
    bench.add_argument("--logs", help="keep the servers' logs in this folder (default: a temporary one, removed)")
    bench.add_argument("--out", help="write the report as JSON here")
    bench.add_argument("--plot", help="draw total tokens/s against clients, a line per server, as a PNG here")
    bench.set_defaults(func=cmd_serve_bench)
