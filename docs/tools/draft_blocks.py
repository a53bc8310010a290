"""Two ways of running EAGLE-3's draft, timed against each other on the same prompts (`--compare`):
- blocks: the draft's matrices on Q8_0 against Q4_1 blocks (ppdkit/runtime/drafters/head_loading.EAGLE3_BLOCK_BITS,
  what a bfloat16 or GGUF decoder drafts with where the CPU has AVX512-VNNI): two decoders, one with each;
- grow: each step's tree grown in one native call against level by level in Python
  (ppdkit/runtime/drafters/eagle3_drafter.py NATIVE_GROW): one decoder, switched between prompts.
Both arms run bfloat16 decoders of the committed draft in one process and decode MT-Bench's first turns with
`eagle3-corpus` and trees of 8 nodes, each prompt by both in turn (which goes first alternating), so that the machine's
drift falls on both alike. Per arm: tok/s, tokens per step, ms a step and ms of it drafting; and on how many prompts the
two gave the same tokens (the verification keeps the base model's tokens whatever the draft guesses, so all of them).

    python docs/tools/draft_blocks.py                     # all 80 prompts, about 8 minutes on 2 cores
    python docs/tools/draft_blocks.py --compare grow      # writes docs/measurements/draft-grow.json
    python docs/tools/draft_blocks.py --limit 8 --out /tmp/draft-blocks.json

Writes docs/measurements/draft-<compare>.json (`--out`); the draft's model card shows it (docs/tools/figure_blocks.py).
It times: run it on an idle machine (infra/corpus/background.sh pause).
"""

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from ppdkit.bench.decoding import load_prompts, machine_info
from ppdkit.models.artifact import read_component
from ppdkit.runtime.drafters import eagle3_drafter
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.head_loading import EAGLE3_BLOCK_BITS, load_eagle3
from ppdkit.runtime.forward.linear import QUANTIZED, native_kernels

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "ppdkit" / "models" / "components" / "smollm2-135m-eagle3"
MEASUREMENTS = ROOT / "docs" / "measurements"
METHOD, TREE, MAX_NEW_TOKENS = "eagle3-corpus", 8, 128
ARMS = {"Q8_0": 8, "Q4_1": 4}


def decoder_with(bits: int) -> Decoder:
    """The committed draft's bfloat16 decoder, its draft's matrices on GGUF blocks of `bits`."""
    decoder = Decoder.from_pretrained(COMPONENT, dtype="bfloat16", tree_size=TREE)
    if bits != EAGLE3_BLOCK_BITS:
        decoder.draft.eagle3 = load_eagle3(read_component(COMPONENT), decoder.hf_model, QUANTIZED, bits)
    return decoder


def block_arms() -> dict[str, tuple[Decoder, Callable[[], None]]]:
    """--compare blocks: a decoder per kind of block."""
    return {arm: (decoder_with(bits), lambda: None) for arm, bits in ARMS.items()}


def grow_arms() -> dict[str, tuple[Decoder, Callable[[], None]]]:
    """--compare grow: one decoder, its trees grown natively or level by level."""
    decoder = decoder_with(EAGLE3_BLOCK_BITS)

    def growing(native: bool) -> Callable[[], None]:
        return lambda: setattr(eagle3_drafter, "NATIVE_GROW", native)
    return {"one native call": (decoder, growing(True)), "level by level": (decoder, growing(False))}


# each comparison's arms, and the one the runtime runs by default
COMPARISONS = {"blocks": (block_arms, "Q4_1" if EAGLE3_BLOCK_BITS == 4 else "Q8_0"),
               "grow": (grow_arms, "one native call")}


def measure(compare: str, limit: int) -> dict:
    """Each arm's figures: {arm: (its decoder, what switches the process to it)}."""
    make, default = COMPARISONS[compare]
    arms = make()
    prompts = [next(iter(arms.values()))[0].encode_chat(p) for p in load_prompts("mt-bench", limit)]
    drafting = dict.fromkeys(arms, 0.0)  # each arm's seconds in propose; the warm-up's are cleared below
    current = [next(iter(arms))]
    propose = eagle3_drafter.Eagle3Drafter.propose

    def timed_propose(drafter, root):  # a step's drafting, as the decode loop counts it
        started = time.perf_counter()
        proposal = propose(drafter, root)
        drafting[current[0]] += time.perf_counter() - started
        return proposal
    eagle3_drafter.Eagle3Drafter.propose = timed_propose
    try:
        for arm, (decoder, switch) in arms.items():  # warm: kernels built, caches and allocators touched
            switch()
            decoder.generate(prompts[0], max_new_tokens=16, method=METHOD)
        drafting.update(dict.fromkeys(arms, 0.0))
        totals = {arm: {"tokens": 0, "steps": 0, "seconds": 0.0} for arm in arms}
        outputs = {arm: [] for arm in arms}
        for i, ids in enumerate(prompts):
            for arm in (list(arms) if i % 2 == 0 else list(arms)[::-1]):
                decoder, switch = arms[arm]
                switch()
                current[0] = arm
                started = time.perf_counter()
                result = decoder.generate(ids, max_new_tokens=MAX_NEW_TOKENS, method=METHOD)
                totals[arm]["seconds"] += time.perf_counter() - started
                totals[arm]["tokens"] += len(result.tokens)
                totals[arm]["steps"] += result.steps
                outputs[arm].append(result.tokens)
    finally:
        del eagle3_drafter.Eagle3Drafter.propose  # the class's own again (GrownDrafter's)
        eagle3_drafter.NATIVE_GROW = True
    figures = {arm: {"default": arm == default, "tokens_per_s": round(t["tokens"] / t["seconds"], 2),
                     "tokens_per_step": round(t["tokens"] / t["steps"], 4),
                     "ms_per_step": round(1000 * t["seconds"] / t["steps"], 3),
                     "drafting_ms_per_step": round(1000 * drafting[arm] / t["steps"], 3)} for arm, t in totals.items()}
    if compare == "blocks":
        for arm, bits in ARMS.items():
            figures[arm]["bits"] = bits
    return {"kind": "draft-arms", "compare": compare, "model": COMPONENT.name, "method": METHOD, "tree_size": TREE,
            "dtype": "bfloat16", "prompts_source": "mt-bench", "prompts": len(prompts),
            "max_new_tokens": MAX_NEW_TOKENS, "arms": figures,
            "identical": sum(a == b for a, b in zip(*outputs.values())),
            "machine": machine_info(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="blocks")
    parser.add_argument("--limit", type=int, default=80, help="MT-Bench first turns (default all 80)")
    parser.add_argument("--out", type=Path, help="default docs/measurements/draft-<compare>.json")
    args = parser.parse_args(argv)
    out = args.out or MEASUREMENTS / f"draft-{args.compare}.json"
    native = native_kernels()
    if native is None:
        print("the native kernels do not run here (no compiler, or neither AVX-512 nor AVX2): the draft runs on "
              "PyTorch's layers, neither way", file=sys.stderr)
        return 1
    if args.compare == "blocks" and not native.quantized_available():
        print("this CPU (or build) has no AVX512-VNNI kernel: its drafts are not on GGUF blocks", file=sys.stderr)
        return 1
    report = measure(args.compare, args.limit)
    report["command"] = ("python docs/tools/draft_blocks.py" + (f" --compare {args.compare}" if args.compare != "blocks"
                                                                else "")
                         + (f" --limit {args.limit}" if args.limit != 80 else "") + (f" --out {args.out}" if args.out
                                                                                      else ""))
    out.write_text(json.dumps(report, indent=2) + "\n")
    for arm, figures in report["arms"].items():
        print(f"{arm}: {figures['tokens_per_s']:.1f} tok/s, {figures['tokens_per_step']:.3f} tokens per step, "
              f"{figures['ms_per_step']:.2f} ms a step, {figures['drafting_ms_per_step']:.2f} of it drafting")
    print(f"same tokens on {report['identical']} of {report['prompts']} prompts; wrote {shlex.quote(str(out))}")
    return 0 if report["identical"] == report["prompts"] else 1


if __name__ == "__main__":
    sys.exit(main())
