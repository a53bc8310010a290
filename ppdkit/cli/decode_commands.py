"""The decoding commands: `ppdkit decode` (one prompt, streamed), `serve` (an OpenAI-compatible server), `profile`
(forward latency per tree size here) and `bench` (methods compared on the same prompts)."""

import argparse
import sys
from pathlib import Path

from ppdkit.runtime.decoding_methods import METHODS as DECODING_METHODS
from ppdkit.runtime.forward.dtypes import DTYPES

LOOKUP_CHAINS_HELP = ("ppd-lookup: chains per step, the context's then the component's n-gram table's "
                      "(default 1: extra rows cost more than they gain on a small CPU)")


def _skip_map(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a skip map is comma-separated integers 0-3, one per layer, not {text!r}")


FIXED_SHAPES = {"auto": None, "on": True, "off": False}  # --fixed-shapes: Decoder's fixed_shapes


def _load_options(args: argparse.Namespace):
    """The LoadOptions the command's flags set (runtime/load_options.py): a component's, or a base model's alone."""
    from ppdkit.runtime.load_options import LoadOptions

    given = {name: getattr(args, name) for name in LoadOptions.model_fields if getattr(args, name, None) is not None}
    return LoadOptions(**{**given, "fixed_shapes": FIXED_SHAPES[args.fixed_shapes]})  # a flag the source refuses: its error


def refuse_unserved_method(model: str, method: str) -> None:
    """A --method that the component in directory `model` cannot carry fails here, from its component.json, before a
    model loads (a minute on a small CPU). What a component carries is what its training method's decoding methods
    need; an early head and the base model's corpus come from elsewhere, and the load checks those."""
    import json

    from ppdkit.models.eagle3 import PARALLEL
    from ppdkit.runtime.decoding_methods import COMPONENT_FREE, Need
    from ppdkit.trainer.training_methods import TRAINING_METHODS

    path = Path(model).expanduser() / "component.json"
    if method in COMPONENT_FREE or not path.is_file():  # a registry URI or a missing directory: the load says what
        return
    card = json.loads(path.read_text())
    trained = TRAINING_METHODS.get(card.get("method"))
    if trained is None:
        return
    carried = {need for m in trained.decoding_methods for need in DECODING_METHODS[m].needs}
    if PARALLEL[0] in card.get("weights", ()):  # an EAGLE-3 draft trained with train.parallel_draft
        carried.add(Need.EAGLE3_PROMPT_TOKENS)
    missing = set(DECODING_METHODS[method].needs) - carried - {Need.EARLY_HEAD, Need.CORPUS}
    if missing:
        lacks = " and ".join(n.value for n in DECODING_METHODS[method].needs if n in missing)
        raise ValueError(f"--method {method} needs {lacks}, which {model} (trained by train.method "
                         f"{trained.name}) does not carry; it serves {', '.join(COMPONENT_FREE)}, "
                         f"{', '.join(trained.decoding_methods)}")


def _prefetch_corpus(model: str, method: str) -> None:
    """Where `method` may draft from the base model's corpus (auto's trial times the corpus methods), its n-gram tables
    start building beside the model's load: on a first decode the two took about 20 s each, one after the other."""
    import json

    from ppdkit.data_pipeline.corpus import committed_corpus, has_committed_corpus
    from ppdkit.runtime.auto import AUTO
    from ppdkit.runtime.decoding_methods import Need
    from ppdkit.runtime.drafters.corpus_ngrams import prefetch_corpus_ngrams

    path = Path(model).expanduser() / "component.json"
    if not path.is_file() or not (method == AUTO or Need.CORPUS in DECODING_METHODS[method].needs):
        return
    base = json.loads(path.read_text()).get("base_model", {}).get("name", "")
    if has_committed_corpus(base):
        prefetch_corpus_ngrams(committed_corpus(base))


def _decoder(args: argparse.Namespace):
    """The decoder of --base (with --skip-map) or --model (with decode's and serve's loading options)."""
    from ppdkit.runtime.decoder import Decoder

    if args.model and getattr(args, "method", None):
        refuse_unserved_method(args.model, args.method)
        _prefetch_corpus(args.model, args.method)
    if args.base:
        return Decoder.from_base(args.base, _load_options(args))
    return Decoder.from_pretrained(args.model, _load_options(args))


def cmd_decode(args: argparse.Namespace) -> int:
    from .console import text_streamer

    decoder = _decoder(args)
    result = decoder.generate(args.prompt, max_new_tokens=args.max_new_tokens, method=args.method,
                              stream=text_streamer(decoder.tokenizer),
                              temperature=args.temperature, acceptance=args.acceptance, epsilon=args.epsilon,
                              delta=args.delta, seed=args.seed)
    rows = result.rows_per_step
    fed = f", {sum(rows) / len(rows):.1f} inputs per step (at most {max(rows)})" if rows else ""
    ran = "" if args.method == result.method else f" ({args.method} ran {result.method}" + (
        f": {decoder.unpaid})" if args.method != "auto" and decoder.unpaid else ")")
    print(f"\n\n[{args.method}]{ran} {len(result.tokens)} tokens in {result.seconds:.2f} s "
          f"({len(result.tokens) / result.seconds:.1f} tok/s), {result.steps} steps, "
          f"{result.mean_accepted_per_step:.2f} tokens per step{fed}", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from ppdkit.serving.server import ServeLimits, serve

    decoder = _decoder(args)
    if args.method not in decoder.methods():
        raise ValueError(f"--method {args.method} is not one this decoder serves; use one of "
                         f"{', '.join(decoder.methods())}")
    serve(decoder, args.name or args.model or args.base, args.host, args.port, args.method,
          ServeLimits(args.max_tokens, args.max_request_bytes, args.max_waiting, args.max_batch))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from ppdkit.runtime.decoder import Decoder

    decoder = Decoder.from_pretrained(args.model, tree_size=None, device=args.device, dtype=args.dtype,
                                      fixed_shapes=FIXED_SHAPES[args.fixed_shapes])
    if args.refresh and decoder.measure_profile is not None:  # the way the load measured it: a grown tree's too
        decoder.measure_profile()
    if decoder.profile is None:
        raise ValueError(f"{args.model} has no trees.json: run the calibrate stage first")
    p = decoder.profile
    print(f"weights {decoder.model.weight_format}, machine {p['machine']}, context {p['context']} tokens, "
          f"one-token forward {p['one_token_ms']:.1f} ms")
    print(f"{'size':>5} {'tau':>6} {'latency ms':>11} {'of it draft':>11} {'tokens/s':>9} {'x one-token':>11}")
    for r in p["rows"]:
        mark = "  <- chosen" if r["size"] == p["chosen"] else ""
        print(f"{r['size']:>5} {r['tau']:>6.2f} {r['latency_ms']:>11.1f} {r.get('draft_ms', 0.0):>11.1f} "
              f"{r['tokens_per_s']:>9.1f} {r['speedup_vs_one_token']:>11.2f}{mark}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from ppdkit.bench.decoding import print_table, run_bench, write_report

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    report = run_bench(args.model or args.base, args.prompts, args.limit, args.max_new_tokens, methods,
                       _load_options(args), base_only=bool(args.base), repeats=args.repeats, command=args.command_line)
    print_table(report)
    if args.out:
        write_report(report, Path(args.out))
    if args.plot:
        from ppdkit.bench.plot import plot_report

        print(f"plot: {plot_report(report, Path(args.plot))}")
    return 0


def cmd_precision(args: argparse.Namespace) -> int:
    from ppdkit.bench.precision_cost import print_precision, run_precision, write_precision

    report = run_precision(args.base, args.prompts, args.limit, args.max_new_tokens, args.texts, args.texts_limit,
                           args.text_tokens, ("float32", args.dtype))
    print_precision(report)
    if args.out:
        write_precision(report, Path(args.out))
    return 0


def add_decoding_commands(sub: argparse._SubParsersAction) -> None:
    """decode, serve, profile, bench and precision; decode, serve and bench share the source (--model or --base) and
    its drafts' options."""
    decode, serve_cmd, prof, bench_dec = (_decode_parser(sub), _serve_parser(sub), _profile_parser(sub),
                                          _bench_parser(sub))
    for parser_ in (decode, serve_cmd):
        _add_tree_options(parser_)
    for parser_ in (decode, bench_dec, serve_cmd):
        _add_source_options(parser_)
    for parser_ in (decode, serve_cmd, prof, bench_dec):
        _add_weight_options(parser_)
    _add_precision_parser(sub)


def _decode_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    decode = sub.add_parser("decode", help="decode a prompt with a component (greedy or sampled, lossless), streaming")
    decode.add_argument("--prompt", required=True)
    decode.add_argument("--max-new-tokens", type=int, default=128)
    decode.add_argument("--method", default="auto", choices=list(DECODING_METHODS),
                        help="auto (default): the fastest method the component serves on this machine, chosen by a "
                             "short measured trial once per machine")
    decode.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); above 0: sampled")
    decode.add_argument("--acceptance", default="speculative", choices=["speculative", "typical"],
                        help="sampled decoding: speculative keeps the model's distribution exactly; typical "
                             "(--epsilon, --delta) accepts more guesses")
    decode.add_argument("--epsilon", type=float, default=0.09)
    decode.add_argument("--delta", type=float, default=0.3)
    decode.add_argument("--seed", type=int, help="fixes the draws of sampled decoding")
    decode.set_defaults(func=cmd_decode)
    return decode


def _serve_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    serve_cmd = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, "
                                             "streaming; /health, /metrics) for a component or a base model")
    serve_cmd.add_argument("--method", default="auto", choices=list(DECODING_METHODS),
                           help="the decoding method of requests that name none (a request's `method` field)")
    serve_cmd.add_argument("--host", default="127.0.0.1", help="the address to bind (default: this machine only)")
    serve_cmd.add_argument("--port", type=int, default=8000)
    serve_cmd.add_argument("--name", help="the model id clients see (default: --model or --base as given)")
    serve_cmd.add_argument("--max-tokens", type=int, default=1024, help="the most new tokens a request may ask for")
    serve_cmd.add_argument("--max-request-bytes", type=int, default=1_000_000)
    serve_cmd.add_argument("--max-batch", type=int, default=64, help="requests decoded together, joining and leaving "
                                                                     "at every step (continuous batching)")
    serve_cmd.add_argument("--max-waiting", type=int, default=64, help="requests queued behind those decoding "
                                                                       "(more get 503)")
    serve_cmd.set_defaults(func=cmd_serve)
    return serve_cmd


def _profile_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    prof = sub.add_parser("profile", help="measure forward latency per tree size here; print tau/L and the choice")
    prof.add_argument("--model", required=True)
    prof.add_argument("--refresh", action="store_true", help="measure again instead of using the cached profile")
    prof.add_argument("--device", default="cpu", help="the torch device to profile (cpu, cuda, cuda:N, mps)")
    prof.set_defaults(func=cmd_profile)
    return prof


def _bench_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    bench_dec = sub.add_parser("bench", help="decoding benchmark: methods on the same prompts, one process")
    bench_dec.add_argument("--prompts", default="mt-bench", help="mt-bench | humaneval | FILE.jsonl")
    bench_dec.add_argument("--limit", type=int, default=10)
    bench_dec.add_argument("--max-new-tokens", type=int, default=128)
    bench_dec.add_argument("--methods", default="hf-greedy,hf-pld,ar,ppd,ppd-lookup",
                           help="comma-separated; a tree method with +dyn picks its tree size per step, e.g. ppd+dyn; "
                                "ar@float32 runs a method on a second decoder in that dtype (ratios in one run); "
                                "llama.cpp, llama.cpp-lookup, llama.cpp-q4 time llama.cpp (ppdkit[llama]); "
                                "llama.cpp-eagle3 and llama.cpp-server its llama-server with and without the EAGLE-3 "
                                "draft (make setup-llama-server)")
    bench_dec.add_argument("--tree-size", type=int, help="as decode's --tree-size")
    bench_dec.add_argument("--lookup-chains", type=int, default=1, help=LOOKUP_CHAINS_HELP)
    bench_dec.add_argument("--repeats", type=int, default=1,
                           help="decode every prompt this many times per method, in turns, and count the fastest "
                                "run (steadier ratios on a busy or drifting machine)")
    bench_dec.add_argument("--out", help="write the report as JSON here")
    bench_dec.add_argument("--plot", help="draw tokens/s and tokens per step by method as a PNG here")
    bench_dec.set_defaults(func=cmd_bench)
    return bench_dec


def _add_tree_options(parser_: argparse.ArgumentParser) -> None:
    """How a component's trees are sized (decode, serve)."""
    parser_.add_argument("--tree-size", type=int, help="a calibrated tree size (default: the size profiled as "
                                                         "fastest on this machine); the grown methods' trees that "
                                                         "many nodes every step")
    parser_.add_argument("--dynamic-size", action="store_true",
                         help="pick the tree size per step from measured step times and acceptance (ProPD 4.2)")
    parser_.add_argument("--lookup-chains", type=int, default=1, help=LOOKUP_CHAINS_HELP)


def _add_source_options(parser_: argparse.ArgumentParser) -> None:
    """What is decoded: a component or a base model alone, and the parts beside it (decode, serve, bench)."""
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
                              "(the PyTorch layers; not run on a GPU by our tests, see docs/devices.md)")


def _add_weight_options(parser_: argparse.ArgumentParser) -> None:
    """How the weights are held and the steps shaped (decode, serve, profile, bench)."""
    parser_.add_argument("--fixed-shapes", default="auto", choices=list(FIXED_SHAPES),
                         help="steps of one shape, so that a tree's rows compute exactly what ar's one-row steps "
                              "do on library kernels: auto (default) on a GPU, off on a CPU (its native kernels "
                              "need none); off on a GPU trades that for speed (docs/devices.md)")
    parser_.add_argument("--dtype", default="auto", choices=list(DTYPES),
                         help="the weights' precision: auto (default) is gguf (the base model's own 4-bit blocks) "
                              "where it has a GGUF and the CPU AVX512-VNNI, else bfloat16 where the native "
                              "kernels run (AVX-512 or AVX2 with FMA) or on a GPU, else float32; every method is lossless against ar in the "
                              "same dtype, float32 gives the float32 model's own tokens")


def _add_precision_parser(sub: argparse._SubParsersAction) -> None:
    precision = sub.add_parser("precision", help="what bfloat16 (or gguf) weights cost against float32: equal greedy "
                                                 "answers, where they part, held-out perplexity")
    precision.add_argument("--base", default="smollm2-135m", help="the base model (default smollm2-135m)")
    precision.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "gguf"],
                           help="the weights compared with float32 (default bfloat16)")
    precision.add_argument("--prompts", default="mt-bench", help="mt-bench | humaneval | FILE.jsonl")
    precision.add_argument("--limit", type=int, default=50)
    precision.add_argument("--max-new-tokens", type=int, default=128)
    precision.add_argument("--texts", default="sharegpt", help="conversations scored teacher-forced (a data source)")
    precision.add_argument("--texts-limit", type=int, default=50)
    precision.add_argument("--text-tokens", type=int, default=512, help="each conversation's first tokens scored")
    precision.add_argument("--out", help="write the report as JSON here")
    precision.set_defaults(func=cmd_precision)
