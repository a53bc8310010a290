"""Fitted tree values: the gate's measure (`ppdkit adopt`: MT-Bench's 80 first turns, trees of 8 nodes, float32, greedy,
128 new tokens) of the committed EAGLE-3 draft with `eagle3-anpd` and `eagle3-corpus`, each with the trees valued by
the draft's own probabilities and by the value model fitted on held-out corpus prompts (the component's
tree_values.json, `ppdkit fit-tree-values`; ppdkit/runtime/trees/tree_values.py). All four must give the same tokens.

    python docs/tools/fitted_values.py

Writes docs/measurements/tree-values.json (`--out`) and prints the table. It measures no time, but a busy machine
makes it slow: pause the corpus job first (infra/corpus/background.sh pause).
"""

import sys
from datetime import datetime, timezone
from pathlib import Path

from ppdkit.bench.decoding import load_prompts, machine_info
from ppdkit.data_pipeline.corpus import committed_corpus, open_corpus
from ppdkit.jobs.adopt import MEASURE, format_shares, measure_component
from ppdkit.models.artifact import read_component
from ppdkit.runtime.trees.tree_values import TREE_VALUES

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gate_tool.py, beside this script
from gate_tool import ROOT, gate_main  # noqa: E402

OUT = ROOT / "docs" / "measurements" / "tree-values.json"
METHODS = ("eagle3-anpd", "eagle3-corpus")
VALUES = {"own": False, "fitted": True}  # the draft's own probabilities; the component's fitted model


def measure_values(component: Path, limit: int | None = None) -> dict:
    fitted = read_component(component).extras.get(TREE_VALUES)
    if fitted is None:
        raise SystemExit(f"{component} has no {TREE_VALUES}.json: fit one with `ppdkit fit-tree-values {component}`")
    prompts = load_prompts(MEASURE["prompts"], limit or MEASURE["limit"])
    corpus = open_corpus(committed_corpus("smollm2-135m"))
    figures, outputs = {}, []
    for method in METHODS:
        for name, use in VALUES.items():
            measured = measure_component(component, prompts, {**MEASURE, "method": method}, label=f"{method} {name}",
                                         fitted_values=use)
            outputs.append(measured.outputs)
            figures.setdefault(method, {})[name] = {"tokens_per_step": round(measured.tokens_per_step, 4),
                                                    "kept_share": measured.kept_share}
    same = sum(all(o == outs[0] for o in outs) for outs in zip(*outputs))
    return {"model": component.name, "prompts": len(prompts),
            "measure": {k: v for k, v in MEASURE.items() if k not in ("method", "limit")},
            "fitted": fitted["fitted"], "weights": fitted["weights"],
            "corpus_tokens": sum(s["tokens"] for s in corpus.shards), "identical": same, "machine": machine_info(),
            "date": datetime.now(timezone.utc).date().isoformat(), "methods": figures}


def values_table(report: dict) -> str:
    head = ("| method | tokens per step, the draft's own values | fitted values | steps keeping at least 1/2/3/4/5 "
            "guesses (own -> fitted) |\n|---|---|---|---|\n")
    return head + "".join(f"| `{name}` | {m['own']['tokens_per_step']:.3f} | {m['fitted']['tokens_per_step']:.3f} | "
                          f"{format_shares(m['own']['kept_share'])} -> {format_shares(m['fitted']['kept_share'])} |\n"
                          for name, m in report["methods"].items())


def main(argv: list[str] | None = None) -> int:
    return gate_main(argv, __doc__, OUT, measure_values, values_table, "the EAGLE-3 component, with its tree_values.json", "the four decodings gave other tokens")


if __name__ == "__main__":
    sys.exit(main())
