"""The corpus as a drafter: the gate's measure (`ppdkit adopt`: MT-Bench's 80 first turns, trees of 8 nodes, float32,
greedy, 128 new tokens) of the committed EAGLE-3 draft with `eagle3-anpd` and with `eagle3-corpus`, which merges a
chain from the committed corpus's n-grams into the same tree (ppdkit/runtime/drafters/corpus_ngrams.py). Both must give
the same tokens; the second keeps more a step where the model's own earlier answers know what comes next.

    python docs/tools/corpus_chain.py

Writes docs/measurements/corpus-chain.json (`--out`) and prints the table. It measures no time, but a busy machine
makes it slow: pause the corpus job first (infra/corpus/background.sh pause).
"""

import sys
from datetime import datetime, timezone
from pathlib import Path

from ppdkit.bench.decoding import load_prompts, machine_info
from ppdkit.data_pipeline.corpus import committed_corpus, open_corpus
from ppdkit.jobs.adopt import MEASURE, format_shares, measure_component
from ppdkit.runtime.drafters.corpus_ngrams import MAX_N, corpus_digest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gate_tool.py, beside this script
from gate_tool import ROOT, gate_main  # noqa: E402

OUT = ROOT / "docs" / "measurements" / "corpus-chain.json"
METHODS = ("eagle3-anpd", "eagle3-corpus")


def measure_chain(component: Path, limit: int | None = None) -> dict:
    prompts = load_prompts(MEASURE["prompts"], limit or MEASURE["limit"])
    corpus = open_corpus(committed_corpus("smollm2-135m"))
    figures, outputs = {}, {}
    for method in METHODS:
        measured = measure_component(component, prompts, {**MEASURE, "method": method}, label=method)
        outputs[method] = measured.outputs
        figures[method] = {"tokens_per_step": round(measured.tokens_per_step, 4), "kept_share": measured.kept_share}
    same = sum(a == b for a, b in zip(*outputs.values()))
    return {"model": component.name, "prompts": len(prompts), "measure": {k: v for k, v in MEASURE.items()
                                                                           if k not in ("method", "limit")},
            "corpus_tokens": sum(s["tokens"] for s in corpus.shards), "corpus_shards": len(corpus.shards),
            "corpus_digest": corpus_digest(corpus.root)[:16], "max_n": MAX_N, "identical": same,
            "machine": machine_info(), "date": datetime.now(timezone.utc).date().isoformat(), "methods": figures}


def chain_table(report: dict) -> str:
    head = ("| method | tokens per step | steps keeping at least 1/2/3/4/5 guesses |\n"
            "|---|---|---|\n")
    return head + "".join(f"| `{name}` | {m['tokens_per_step']:.3f} | {format_shares(m['kept_share'])} |\n"
                          for name, m in report["methods"].items())


def main(argv: list[str] | None = None) -> int:
    return gate_main(argv, __doc__, OUT, measure_chain, chain_table, "the EAGLE-3 component", "eagle3-corpus gave other tokens than eagle3-anpd")


if __name__ == "__main__":
    sys.exit(main())
