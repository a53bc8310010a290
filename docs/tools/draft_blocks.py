"""EAGLE-3's draft on Q8_0 against Q4_1 blocks (ppdkit/runtime/head_loading.EAGLE3_BLOCK_BITS, what a bfloat16 or GGUF
decoder drafts with where the CPU has AVX512-VNNI): two bfloat16 decoders of the committed draft in one process, one
with each, decode MT-Bench's first turns with `eagle3-corpus` and trees of 8 nodes, each prompt by both in turn (which
goes first alternating), so that the machine's drift falls on both alike. Per arm: tok/s, tokens per step and ms a
step; and on how many prompts the two gave the same tokens (the verification keeps the base model's tokens whatever
the draft guesses, so all of them).

    python docs/tools/draft_blocks.py                     # all 80 prompts, about 8 minutes on 2 cores
    python docs/tools/draft_blocks.py --limit 8 --out /tmp/draft-blocks.json

Writes docs/measurements/draft-blocks.json (`--out`); the draft's model card shows it (docs/tools/figure_blocks.py).
It times: run it on an idle machine (infra/corpus/background.sh pause).
"""

import argparse
import json
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from ppdkit.bench.decoding import load_prompts, machine_info
from ppdkit.models.artifact import read_component
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.head_loading import EAGLE3_BLOCK_BITS, load_eagle3
from ppdkit.runtime.linear import QUANTIZED, native_kernels

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "ppdkit" / "models" / "components" / "smollm2-135m-eagle3"
OUT = ROOT / "docs" / "measurements" / "draft-blocks.json"
METHOD, TREE, MAX_NEW_TOKENS = "eagle3-corpus", 8, 128
ARMS = {"Q8_0": 8, "Q4_1": 4}


def decoder_with(bits: int) -> Decoder:
    """The committed draft's bfloat16 decoder, its draft's matrices on GGUF blocks of `bits`."""
    decoder = Decoder.from_pretrained(COMPONENT, dtype="bfloat16", tree_size=TREE)
    if bits != EAGLE3_BLOCK_BITS:
        decoder.draft.eagle3 = load_eagle3(read_component(COMPONENT), decoder.hf_model, QUANTIZED, bits)
    return decoder


def measure(limit: int) -> dict:
    decoders = {arm: decoder_with(bits) for arm, bits in ARMS.items()}
    prompts = [decoders["Q8_0"].encode_chat(p) for p in load_prompts("mt-bench", limit)]
    for decoder in decoders.values():  # warm: kernels built, caches and allocators touched
        decoder.generate(prompts[0], max_new_tokens=16, method=METHOD)
    totals = {arm: {"tokens": 0, "steps": 0, "seconds": 0.0} for arm in ARMS}
    outputs = {arm: [] for arm in ARMS}
    for i, ids in enumerate(prompts):
        for arm in (list(ARMS) if i % 2 == 0 else list(ARMS)[::-1]):
            started = time.perf_counter()
            result = decoders[arm].generate(ids, max_new_tokens=MAX_NEW_TOKENS, method=METHOD)
            totals[arm]["seconds"] += time.perf_counter() - started
            totals[arm]["tokens"] += len(result.tokens)
            totals[arm]["steps"] += result.steps
            outputs[arm].append(result.tokens)
    arms = {arm: {"bits": ARMS[arm], "tokens_per_s": round(t["tokens"] / t["seconds"], 2),
                  "tokens_per_step": round(t["tokens"] / t["steps"], 4),
                  "ms_per_step": round(1000 * t["seconds"] / t["steps"], 3)} for arm, t in totals.items()}
    return {"kind": "draft-blocks", "model": COMPONENT.name, "method": METHOD, "tree_size": TREE, "dtype": "bfloat16",
            "prompts_source": "mt-bench", "prompts": len(prompts), "max_new_tokens": MAX_NEW_TOKENS,
            "default_bits": EAGLE3_BLOCK_BITS, "arms": arms,
            "identical": sum(a == b for a, b in zip(*outputs.values())),
            "machine": machine_info(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=80, help="MT-Bench first turns (default all 80)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    native = native_kernels()
    if native is None or not native.quantized_available():
        print("this CPU (or build) has no AVX512-VNNI kernel: its drafts are not on GGUF blocks", file=sys.stderr)
        return 1
    report = measure(args.limit)
    report["command"] = "python docs/tools/draft_blocks.py" + (f" --limit {args.limit}" if args.limit != 80 else "")
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for arm, figures in report["arms"].items():
        print(f"{arm}: {figures['tokens_per_s']:.1f} tok/s, {figures['tokens_per_step']:.3f} tokens per step, "
              f"{figures['ms_per_step']:.2f} ms a step")
    print(f"same tokens on {report['identical']} of {report['prompts']} prompts; wrote {shlex.quote(str(args.out))}")
    return 0 if report["identical"] == report["prompts"] else 1


if __name__ == "__main__":
    sys.exit(main())
