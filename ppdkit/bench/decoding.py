"""`ppdkit bench`: every decoding method on the same prompts in one process, as ratios to hf-greedy.

hf-greedy is transformers' greedy `generate`, hf-pld its prompt-lookup mode; ar and ppd run on the
bundled lean runtime. identical_to_greedy is the fraction of prompts whose tokens equal hf-greedy's;
each divergence is examined: the top-2 logit gap of the base model where the outputs part, so a
floating-point near-tie can be told from a logic error.
"""

import json
import logging
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm import tqdm

from ppdkit.data_pipeline.readers import read_conversations
from ppdkit.runtime.answer_tokens import GenerateResult
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.decoding_methods import METHODS, get_method
from ppdkit.runtime.load_options import LoadOptions, load_options
from ppdkit.runtime.drafters.draft_parts import DraftParts, HeadParts, PromptTokenParts, SizedParts
from ppdkit.runtime.kernels.native import cpu_info
from ppdkit.runtime.forward.dtypes import DTYPES

from .llama_cpp import LLAMA_METHODS, LLAMA_PLAIN, llama_runners, llama_systems
from .step_breakdown import print_breakdown, step_breakdown

log = logging.getLogger(__name__)
HF_METHODS = ("hf-greedy", "hf-pld")  # transformers' own greedy and prompt-lookup decoding, the reference
ALL_METHODS = (*HF_METHODS, *METHODS, *LLAMA_METHODS)
DYNAMIC = "+dyn"  # a tree method with this suffix picks its tree size per step (runtime/trees/tree_sizer.py)
AT = "@"  # a method with this suffix and a dtype (ar@float32) runs on a second decoder in that dtype, same run
NEAR_TIE = 1e-4
# the CPU features that decide which matmul paths torch and the runtime's kernels take (float32 vs bf16 vs AMX)
ISA_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")  # the formats' units
# the variables that change which kernels run (runtime/kernels/native.py; oneDNN's own cap on the ISA it uses)
KERNEL_SETTINGS = ("PPDKIT_NATIVE_CFLAGS", "PPDKIT_BF16_KERNEL", "PPDKIT_BF16_FMA_ROWS", "ONEDNN_MAX_CPU_ISA")


def load_prompts(source: str, limit: int | None) -> list[str]:
    """mt-bench | humaneval | FILE.jsonl with {"prompt": ...} or {"turns": [...]} lines (first turn)."""
    conversations, report = read_conversations(source, limit)
    if not conversations:
        raise ValueError(f"no prompt in {source!r}: {report.describe()}")
    if any(c.has_turns_to_write() for c in conversations):  # magpie's: empty until a data run writes them
        raise ValueError(f"the prompts of {source!r} are left for the base model to write, which a data run's "
                         "teacher stage does: bench on a prompt set or a file of prompts instead")
    return [c.first_user_turn for c in conversations]


def _hf_generate(decoder: Decoder, ids: list[int], max_new_tokens: int, pld: bool) -> list[int]:
    extra = {"prompt_lookup_num_tokens": 10} if pld else {}
    out = decoder.hf_model.generate(torch.tensor([ids], device=decoder.device),
                                    attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=decoder.device),
                                    max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None,
                                    top_k=None, pad_token_id=decoder.tokenizer.pad_token_id, **extra)
    return out[0, len(ids):].tolist()


def run_method(decoder: Decoder, method: str, ids: list[int], max_new_tokens: int, llama: dict | None = None,
               others: dict[str, Decoder] | None = None) -> tuple[list[int], int, list[int], float, list[int],
                                                                  GenerateResult | None]:
    """(new tokens, decoding steps, the tree size of each step, tree rows dropped by early pruning, the inputs each
    step fed the model, ppdkit's result with its timings: None for the baselines). `llama`: the llama.cpp runners
    by method (bench/llama_cpp.py); `others`: the decoders of other dtypes, for method@dtype."""
    if method in LLAMA_METHODS:
        tokens = llama[method].generate(ids, max_new_tokens)
        return tokens, llama[method].steps, [], 0.0, [], None
    if AT in method:  # the same method on the decoder of another dtype
        method, _, dtype = method.partition(AT)
        decoder = others[dtype]
    if method in HF_METHODS:
        tokens = _hf_generate(decoder, ids, max_new_tokens, pld=method == "hf-pld")
        return tokens, len(tokens), [], 0.0, [], None
    sized = isinstance(decoder.draft, SizedParts)
    if sized:
        decoder.draft.dynamic_size = method.endswith(DYNAMIC)
    result = decoder.generate(ids, max_new_tokens=max_new_tokens, method=method.removesuffix(DYNAMIC))
    tree_method = sized and get_method(method.removesuffix(DYNAMIC)).sized
    fixed = [decoder.draft.size] * (result.steps - 1) if tree_method else []  # a tree method, one size
    return (result.tokens, result.steps, result.tree_sizes or fixed, sum(result.pruned_rows), result.rows_per_step,
            result)


def _plain(method: str) -> str:
    """The decoding method a bench method names: ppd+dyn -> ppd, ar@float32 -> ar."""
    return method.partition(AT)[0].removesuffix(DYNAMIC)


def reference_of(method: str, order: list[str], weights: str) -> str:
    """What a method's output must equal: transformers' greedy decoding in float32; in bfloat16 ppdkit's own `ar`
    (transformers' bfloat16 model rounds its activations to bfloat16 too, ppdkit's runtime keeps them float32:
    runtime/forward/precision.py), and on gguf or q4 blocks too (transformers' float32 model holds the weights, not the
    int8 activations); for llama.cpp's speculative decoding llama.cpp's own plain decoding, and for its plain
    decoding itself (its kernels round otherwise: it is timed, not held to ppdkit's tokens)."""
    if method in LLAMA_METHODS:
        return LLAMA_PLAIN.get(method, method)
    if AT in method:  # another dtype: that dtype's own ar, where it runs
        other = "ar" + AT + method.partition(AT)[2]
        return other if other in order else method
    return "ar" if weights != "float32" and "ar" in order else "hf-greedy"


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The index of the first token where a and b part (the shorter one's end when one stops early), None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def exact_dtype(decoder: Decoder, asked: str) -> Decoder:
    """`decoder`, loaded for `asked`, refused where the runtime fell back to another dtype (bfloat16 where its kernels
    do not run): a figure measured in float32 must not be reported as bfloat16's."""
    ran = decoder.model.weight_format
    if ran != asked:
        raise ValueError(f"{asked} cannot run here (the runtime fell back to {ran}): see docs/devices.md")
    return decoder


def divergence(decoder: Decoder, ids: list[int], ours: list[int], greedy: list[int]) -> dict:
    """Where two outputs part, and the base model's top-2 logit gap there (fp32, transformers)."""
    at = first_difference(ours, greedy)
    with torch.no_grad():
        logits = decoder.hf_model(torch.tensor([ids + greedy[:at]], device=decoder.device)).logits[0, -1].float()
    top2 = logits.topk(2).values
    gap = (top2[0] - top2[1]).item()
    return {"index": at, "top2_gap": gap, "near_tie": gap < NEAR_TIE}


def run_bench(model: str, prompts_source: str, limit: int | None, max_new_tokens: int, methods: list[str],
              options: LoadOptions | None = None, base_only: bool = False, repeats: int = 1,
              command: str | None = None, **load_overrides) -> dict:
    """`model` a component (directory or models:/ URI), or with `base_only` a base model for the methods that
    need no component (`skip_map` for skip), loaded as `options` (runtime/load_options.py; any of them overridable by
    keyword) say: every method, the transformers baselines too, runs on its device with the weights in its dtype.
    `repeats` > 1 decodes every prompt that many times with every method, in turns, and counts each method's
    fastest run: a ratio of a few percent then stands out of this machine's minute-to-minute drift. `command` is what
    made the report (the command line, or the pipeline stage), kept with its date and machine so a figure can be
    traced and reproduced."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    unknown = [m for m in methods if _plain(m) not in ALL_METHODS
               or m.endswith(DYNAMIC) and _plain(m) in ("ar", *HF_METHODS)
               or AT in m and (m.partition(AT)[2] not in DTYPES[1:] or _plain(m) in (*HF_METHODS, *LLAMA_METHODS))]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; use {', '.join(ALL_METHODS)}, a tree method with "
                         f"{DYNAMIC} for its size picked per step, or one of ours with {AT}float32 or {AT}bfloat16 to "
                         "run it on a second decoder in that dtype")

    options = load_options(options, load_overrides)

    def loaded(dtype: str) -> Decoder:
        if base_only:
            return Decoder.from_base(model, options, dtype=dtype)
        return Decoder.from_pretrained(model, options, dtype=dtype, dynamic_size=True)  # +dyn: every size ready

    decoder = loaded(options.dtype)
    others = {other: exact_dtype(loaded(other), other) for other in {m.partition(AT)[2] for m in methods if AT in m}}
    unserved = [m for m in methods if m not in (*HF_METHODS, *LLAMA_METHODS) and _plain(m) not in decoder.methods()]
    if unserved:
        raise ValueError(f"{model} cannot serve {', '.join(unserved)}: it serves {', '.join(decoder.methods())} "
                         "(and the transformers baselines)")
    prompts = [decoder.encode_chat(p) for p in load_prompts(prompts_source, limit)]
    # llama.cpp's speculative outputs are compared with its own plain decoding of the same file
    methods = [*methods, *(LLAMA_PLAIN[m] for m in methods if m in LLAMA_PLAIN and LLAMA_PLAIN[m] not in methods)]
    weights = decoder.model.weight_format
    llama = llama_runners(decoder.base_name, weights, methods, torch.get_num_threads(),
                          None if base_only else str(model), max_new_tokens)
    order = ["hf-greedy"] + [m for m in methods if m != "hf-greedy"]  # hf-greedy always runs: the baseline
    if weights != "float32" and "ar" not in order:  # and in other weights ppdkit's own ar, what outputs must equal
        order.insert(1, "ar")  # (hf-greedy rounds otherwise there: reference_of)
    try:
        return _measure(decoder, others, llama, order, prompts, prompts_source, model, max_new_tokens, repeats,
                        command)
    finally:
        for runner in llama.values():
            runner.close()


def _measure(decoder: Decoder, others: dict[str, Decoder], llama: dict, order: list[str], prompts: list[list[int]],
             prompts_source: str, model: str, max_new_tokens: int, repeats: int, command: str | None) -> dict:
    """The bench proper: every method on every prompt, in turns, then the report."""
    weights = decoder.model.weight_format
    # warm-up, a whole answer each: first-call allocations, lazy initialisation and the decoder's checks of its cached
    # timings (trees/profile_check.py: a stale profile measured again, a stale auto trial run again) are not measured
    for method in order:
        run_method(decoder, method, prompts[0], max_new_tokens, llama, others)
    outputs: dict[str, list[list[int]]] = {m: [] for m in order}
    stats = {m: {"seconds": 0.0, "new_tokens": 0, "steps": 0, "sizes": [], "pruned": 0.0, "rows": []} for m in order}
    timings: dict[str, list[tuple[float, GenerateResult]]] = {m: [] for m in order}  # (seconds, result): breakdown
    for index, ids in enumerate(tqdm(prompts, desc="bench", unit="prompt")):
        fastest: dict[str, tuple[float, tuple]] = {}
        for _ in range(repeats):
            for method in order:  # interleaved: drift in machine speed hits every method alike
                started = time.perf_counter()
                run = run_method(decoder, method, ids, max_new_tokens, llama, others)
                seconds = time.perf_counter() - started
                if method in fastest and run[0] != fastest[method][1][0]:
                    raise RuntimeError(f"{method} gave different tokens on two runs of prompt {index}: greedy "
                                       "decoding should be deterministic; report this with the prompt")
                if method not in fastest or seconds < fastest[method][0]:
                    fastest[method] = (seconds, run)
        for method, (seconds, (tokens, steps, sizes, pruned, rows, result)) in fastest.items():
            if result is not None:
                timings[method].append((seconds, result))
            stats[method]["seconds"] += seconds
            stats[method]["new_tokens"] += len(tokens)
            stats[method]["steps"] += steps
            stats[method]["sizes"] += sizes
            stats[method]["pruned"] += pruned
            stats[method]["rows"] += rows
            outputs[method].append(tokens)
    results = []
    for method in order:
        reference = reference_of(method, order, weights)
        same = [a == b for a, b in zip(outputs[method], outputs[reference])]
        row = {"method": method, "prompts": len(prompts), "new_tokens": stats[method]["new_tokens"],
               "seconds": stats[method]["seconds"],
               "tokens_per_s": stats[method]["new_tokens"] / stats[method]["seconds"],
               "mean_accepted_per_step": stats[method]["new_tokens"] / max(stats[method]["steps"], 1),
               "mean_tree_size": sum(stats[method]["sizes"]) / len(stats[method]["sizes"]) if stats[method]["sizes"]
               else None,
               # what a step costs: the inputs it fed the model (drafts' own forwards, as skip's, aside)
               "mean_rows_per_step": sum(stats[method]["rows"]) / len(stats[method]["rows"]) if stats[method]["rows"]
               else None,
               # of the rows the trees fed after the early head's layer, the share dropped (pruning methods)
               "pruned_fraction": stats[method]["pruned"] / max(sum(_rows(decoder, s) for s in stats[method]["sizes"]), 1),
               "identical_to_greedy": sum(same) / len(same), "compared_with": reference}
        # where an output parts from its reference, the model's top-2 gap there: for ppdkit's own methods only
        # (llama.cpp's kernels, or transformers' bfloat16 arithmetic against ar's, part by design)
        examined = method not in LLAMA_METHODS and not (method in HF_METHODS and reference != "hf-greedy")
        row["divergences"] = [] if not examined else [
            {"prompt": i, **divergence(decoder, prompts[i], outputs[method][i], outputs[reference][i])}
            for i, ok in enumerate(same) if not ok]
        if timings[method]:  # where its time went: the prompt, drafting by part, verification by rows, the rest
            row["breakdown"] = step_breakdown(timings[method])
        ran_by = others[method.partition(AT)[2]] if AT in method else decoder
        if _plain(method) == "auto":  # which method that was: the trial's choice for this decoder and machine
            row["ran"] = ran_by.fastest_method()
        elif _plain(method) in METHODS and (ran := ran_by.resolve_method(_plain(method))) != _plain(method):
            row["ran"], row["why"] = ran, ran_by.unpaid  # no tree size pays here: it ran plain steps
        results.append(row)
    base = next(r for r in results if r["method"] == "hf-greedy")["tokens_per_s"]
    ar = next((r["tokens_per_s"] for r in results if r["method"] == "ar"), None)
    for row in results:
        row["speedup_vs_hf_greedy"] = row["tokens_per_s"] / base
        if ar is not None:  # our own plain decoding: what the drafts themselves add
            row["speedup_vs_ar"] = row["tokens_per_s"] / ar
    ar_step = next((r["breakdown"]["step_ms"] for r in results if r["method"] == "ar" and "breakdown" in r), None)
    for row in results:
        if ar_step and "breakdown" in row:  # what a step costs against a plain one (issue: <= 1.5x)
            row["breakdown"]["step_vs_ar"] = row["breakdown"]["step_ms"] / ar_step
    tree_size = _tree_size(decoder.draft)
    return {"model": str(model), "prompts_source": prompts_source, "max_new_tokens": max_new_tokens,
            "repeats": repeats, "tree_size": tree_size, "profile": decoder.profile, "device": str(decoder.device),
            # fixed_rows: steps of one shape (runtime/forward/fixed_shapes.py)
            "dtype": weights, "fixed_rows": decoder.model.fixed_rows,
            "threads": torch.get_num_threads(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info(device=decoder.device), "command": command, "results": results,
            **llama_systems(llama)}


def machine_info(cpuinfo: Path = Path("/proc/cpuinfo"), device: torch.device | None = None) -> dict:
    """Where a report was measured: CPU model, cores, torch threads, the matmul ISA flags, torch and ppdkit versions
    (the commit, and the files under ppdkit/ that differed from it: an adopted draft not yet committed, say), the
    kernel settings that were set (KERNEL_SETTINGS: AMX left out of the build, say); with a CUDA `device`, the GPU's
    name too (the CPU is then its host)."""
    from ppdkit.registry.tracking import ppdkit_commit, ppdkit_uncommitted

    fields = cpu_info(cpuinfo)  # {} off Linux: platform's name stands in and the flags are unknown
    flags = set(fields.get("flags", "").split())
    gpu = {"gpu": torch.cuda.get_device_name(device)} if device is not None and device.type == "cuda" else {}
    settings = {name: os.environ[name] for name in KERNEL_SETTINGS if os.environ.get(name)}
    return {**gpu, "cpu": fields.get("model name") or platform.processor() or platform.machine(),
            "logical_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "isa": [f for f in ISA_FLAGS if f in flags] if flags else None,
            "torch": torch.__version__, "ppdkit_commit": ppdkit_commit(), "ppdkit_uncommitted": ppdkit_uncommitted(),
            **({"kernel_settings": settings} if settings else {})}


def describe_machine(machine: dict) -> str:
    """One line for a table's caption or a plot's title: `AMD EPYC, 2 cores (2 threads), avx512f+avx512_bf16`
    (`NVIDIA H200 beside ...` for a GPU's report)."""
    flags = machine.get("isa")
    isa = "ISA flags unknown" if flags is None else "+".join(flags) or "no AVX-512 or AMX"
    gpu = f"{machine['gpu']} beside " if machine.get("gpu") else ""
    settings = "".join(f", {name}={value}" for name, value in machine.get("kernel_settings", {}).items())
    return (f"{gpu}{machine.get('cpu', '?')}, {machine.get('logical_cores', '?')} cores "
            f"({machine.get('torch_threads', '?')} threads), {isa}{settings}")


def describe_commit(machine: dict) -> str:
    """`, ppdkit commit 0123456789` for a report's caption, naming the files under ppdkit/ that differed from it when
    there were any (`, ppdkit commit 0123456789 with 2 files changed: ...`); "" where no commit was recorded."""
    commit = machine.get("ppdkit_commit")
    if not commit:
        return ""
    changed = machine.get("ppdkit_uncommitted") or []
    listed = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return f", ppdkit commit {commit[:10]}" + (f" with {len(changed)} files changed: {listed}" if changed else "")


def _rows(decoder: Decoder, size: int) -> int:
    """The rows of a draft-head tree of calibrated size `size` (a PPD tree's are its size)."""
    tree = decoder.draft.trees.get(size) if isinstance(decoder.draft, HeadParts) else None
    return tree.layout.nodes if tree is not None else size


def _tree_size(draft: DraftParts) -> int | None:
    """The calibrated tree in use: a PPD tree's size, a head tree's rows; None where trees are grown or none."""
    if isinstance(draft, PromptTokenParts) and draft.tree is not None:
        return draft.tree.size
    if isinstance(draft, HeadParts) and draft.head_tree is not None:
        return draft.head_tree.layout.size
    return None


def print_table(report: dict) -> None:
    width = max(16, *(len(r["method"]) for r in report["results"]))
    print(f"\n{'method':<{width}} {'prompts':>7} {'tokens':>7} {'seconds':>8} {'tok/s':>7} {'x greedy':>8} {'x ar':>6} "
          f"{'tok/step':>8} {'rows':>5} {'tree':>5} {'pruned':>6} {'identical':>9}")
    for r in report["results"]:
        vs_ar = f"{r['speedup_vs_ar']:>6.2f}" if "speedup_vs_ar" in r else f"{'-':>6}"
        tree = f"{r['mean_tree_size']:>5.1f}" if r.get("mean_tree_size") else f"{'-':>5}"
        rows = f"{r['mean_rows_per_step']:>5.1f}" if r.get("mean_rows_per_step") else f"{'-':>5}"
        pruned = f"{r['pruned_fraction']:>6.2f}" if r.get("pruned_fraction") else f"{'-':>6}"
        print(f"{r['method']:<{width}} {r['prompts']:>7} {r['new_tokens']:>7} {r['seconds']:>8.1f} {r['tokens_per_s']:>7.1f} "
              f"{r['speedup_vs_hf_greedy']:>8.2f} {vs_ar} {r['mean_accepted_per_step']:>8.2f} {rows} {tree} {pruned} "
              f"{r['identical_to_greedy']:>9.2f}")
        if "ran" in r:
            print(f"    ran {r['ran']}: {r['why']}" if r.get("why") else
                  f"    ran {r['ran']} (the fastest in its trial on this machine)")
        for d in r["divergences"]:
            kind = "near-tie" if d["near_tie"] else "NOT a near-tie"
            print(f"    prompt {d['prompt']}: parts at token {d['index']}, top-2 gap {d['top2_gap']:.2e} ({kind})")
    compared = sorted({r.get("compared_with", "hf-greedy") for r in report["results"]})
    print(f"weights {report.get('dtype', 'float32')}; identical: outputs equal to {' or '.join(compared)}'s, token "
          "for token (ar's in bfloat16, gguf and q4: transformers' model rounds otherwise; llama.cpp's to its own "
          "plain)")
    if report.get("repeats", 1) > 1:
        print(f"(seconds: each prompt's fastest of {report['repeats']} runs per method)")
    if "machine" in report:  # reports written before these fields lack them
        print(f"measured {report['date']} on {describe_machine(report['machine'])}")
    if report.get("llama_cpp_system"):
        print(f"llama.cpp built for: {report['llama_cpp_system']}")
    print_breakdown(report["results"])


def write_report(report: dict, path: Path) -> None:
    path.write_text(json.dumps(report, indent=2))
