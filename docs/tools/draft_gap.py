"""Where the draft's held-out accuracy and chat part ways: the gate's measure (`ppdkit adopt`: eagle3-anpd, trees of 8
nodes, float32, greedy, 128 new tokens) on MT-Bench first turns and on the first turns of the training run's own
held-out corpus conversations (never trained on), by source. Where the held-out rows keep many more guesses than
MT-Bench, the prompts are what the draft lacks; where they keep about as many, it is the draft itself.

    python docs/tools/draft_gap.py --model <cache>/runs/<run>/train/component --run <cache>/runs/<run> \
        --trained <cache>/runs/<an earlier run of its lineage> ...

A run's held-out rows are only clean of what the draft learned if no earlier run it started from trained on them:
`--trained` leaves out the training rows of those runs (runs whose data stage split the corpus by a seeded shuffle,
before held-out rows were chosen by id and stayed held out).

Writes docs/measurements/draft-gap.json (`--out`) and prints the table. Run it with nothing else on the cores: it
measures no time, but a busy machine makes it slow.
"""

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import datasets

from ppdkit.bench.decoding import load_prompts, machine_info
from ppdkit.data_pipeline.corpus import committed_corpus, open_corpus, read_rows
from ppdkit.jobs.adopt import MEASURE, format_shares, measure_component

OUT = Path(__file__).resolve().parents[1] / "measurements" / "draft-gap.json"
GROUPS = ("magpie", "sharegpt", "chitchat")  # a corpus source by its first word: magpie-writing -> magpie


def held_out_prompts(run_dir: Path, limit: int, trained: tuple[Path, ...] = ()) -> dict[str, list[list[int]]]:
    """The templated prompts (the ids before the first answer) of the run's held-out corpus conversations that none
    of the `trained` runs trained on, at most `limit` per source group, in the held-out set's order."""
    seen = {i for run in trained for i in datasets.load_from_disk(str(run / "data" / "train"))["id"]}
    held_out = [i for i in datasets.load_from_disk(str(run_dir / "data" / "holdout"))["id"] if i not in seen]
    rows = {r.id: r for r in read_rows(open_corpus(committed_corpus("smollm2-135m")))}
    missing = [i for i in held_out if i not in rows]
    if missing:
        raise SystemExit(f"{len(missing)} held-out conversations of {run_dir} (first: {missing[0]}) are not in the "
                         "committed corpus: the run read another corpus")
    prompts: dict[str, list[list[int]]] = {g: [] for g in GROUPS}
    for i in held_out:
        row = rows[i]
        group = row.source.split("-")[0]
        if group in prompts and len(prompts[group]) < limit and row.answer_spans:
            prompts[group].append(row.input_ids[:row.answer_spans[0][0]])
    return prompts


def measure_gap(model: Path, run_dir: Path, limit: int, trained: tuple[Path, ...] = ()) -> dict:
    sets = {"mt-bench": load_prompts(MEASURE["prompts"], MEASURE["limit"]),
            **{f"held-out {g}": p for g, p in held_out_prompts(run_dir, limit, trained).items() if p}}
    result = json.loads((run_dir / "train" / "result.json").read_text())
    best = next(e for e in result["evals"] if e["step"] == result["best_step"])
    figures = {}
    for name, prompts in sets.items():
        measured = measure_component(model, prompts, label=name)
        figures[name] = {"prompts": len(prompts), "tokens_per_step": round(measured.tokens_per_step, 4),
                         "kept_share": measured.kept_share}
    return {"model": model.name, "run": run_dir.name, "trained_runs_left_out": [r.name for r in trained],
            "measure": {k: v for k, v in MEASURE.items() if k != "limit"},
            "heldout_top1": [round(best[k], 4) for k in sorted(k for k in best if k.startswith("acc_top1_d"))],
            "machine": machine_info(), "date": datetime.now(timezone.utc).date().isoformat(), "sets": figures}


def gap_table(report: dict) -> str:
    head = ("| prompts | first turns | tokens per step | steps keeping at least 1/2/3/4/5 guesses |\n"
            "|---|---|---|---|\n")
    return head + "".join(
        f"| {name} | {s['prompts']} | {s['tokens_per_step']:.3f} | "
        f"{format_shares(s['kept_share'])} |\n" for name, s in report["sets"].items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the EAGLE-3 component (the run's train/component)")
    parser.add_argument("--run", required=True, help="the run that trained it (its data/holdout, train/result.json)")
    parser.add_argument("--trained", action="append", default=[], help="an earlier run of the draft's lineage: "
                        "its training rows are left out of the held-out prompts (repeatable)")
    parser.add_argument("--limit", type=int, default=40, help="held-out first turns per source group")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    report = measure_gap(Path(args.model), Path(args.run), args.limit, tuple(Path(t) for t in args.trained))
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(gap_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
