"""The draft-data scaling table: what each training run on one teacher cache reached, read from its stage summaries.

Each argument is LABEL=RUN_DIR, a `ppdkit run` output made with `--reuse` of the same cache (recipe:
ppdkit/jobs/configs/smollm2-draft-data.yaml, whose header gives the commands). Per run: the positions it trains on and
those its steps saw, the held-out top-1 accuracy of each draft depth at the kept checkpoint (train), the expected
tokens per step of the calibrated trees (calibrate) and the evaluate stage's tokens per step and speed of each
decoding method. Writes docs/measurements/draft-scaling.json (`--out`) and prints the table as Markdown:

    python docs/tools/scaling_table.py 137k=runs/fh-137k 500k=runs/fh-500k full=runs/fh-full medusa=runs/medusa
"""

import argparse
import json
from pathlib import Path

import yaml

from ppdkit.jobs.pipeline import read_summary

OUT = Path(__file__).resolve().parents[1] / "measurements" / "draft-scaling.json"
DEPTHS = 4  # the table's top-1 columns: draft depths 1-4
TAU_SIZES = (8, 16, 32)


def run_row(label: str, run_dir: Path) -> dict:
    """The figures of one run, or a clear error naming the stage that is missing."""
    summaries = {}
    for stage in ("train", "calibrate", "evaluate"):
        summaries[stage] = read_summary(run_dir / stage)
        if summaries[stage] is None:
            raise SystemExit(f"{run_dir}: its {stage} stage is not complete (no {stage}/summary.json): finish the run "
                             "with the same `ppdkit run` command first")
    train, calibrate, evaluate = summaries["train"], summaries["calibrate"], summaries["evaluate"]
    spec = yaml.safe_load((run_dir / "spec.yaml").read_text()) if (run_dir / "spec.yaml").is_file() else {}
    train_spec = spec.get("train", {})
    teacher = read_summary(run_dir / "teacher") or {}
    subset = train_spec.get("train_positions")  # None: the whole training split
    methods = {key.removesuffix("_accepted_per_step"): {"tokens_per_step": value,
                                                        "tokens_per_s": evaluate.get(key.replace("accepted_per_step",
                                                                                                 "tokens_per_s"))}
               for key, value in evaluate.items() if key.endswith("_accepted_per_step")}
    return {"label": label, "method": train_spec.get("method"),
            "train_positions": subset if subset is not None else teacher.get("splits", {}).get("train", {}).get(
                "positions"),
            "positions_seen": train.get("trained_positions"), "steps": train.get("steps"),
            "best_step": train.get("best_step"),
            "top1": {d: train.get(f"best_acc_top1_d{d}") for d in range(1, DEPTHS + 1)},
            "tau": {size: calibrate.get(f"tau_size{size}") for size in TAU_SIZES},
            "evaluate_tree_size": evaluate.get("tree_size"), "methods": methods}


def markdown(rows: list[dict]) -> str:
    def cell(value, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else f"{value:,}"

    head = (["run", "training positions", "positions seen", *[f"top-1 d{d}" for d in range(1, DEPTHS + 1)],
             *[f"tau@{s}" for s in TAU_SIZES], "best method: tokens/step, x ar"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        methods = {m: f for m, f in row["methods"].items() if m not in ("ar", "hf_greedy")}
        ar = row["methods"].get("ar", {}).get("tokens_per_s")
        best = max(methods, key=lambda m: methods[m]["tokens_per_s"] or 0, default=None)
        said = "-" if best is None else (f"{best}: {methods[best]['tokens_per_step']:.2f}"
                                         + (f", {methods[best]['tokens_per_s'] / ar:.2f}x" if ar else ""))
        lines.append("| " + " | ".join([row["label"], cell(row["train_positions"]), cell(row["positions_seen"]),
                                        *[cell(row["top1"][d]) for d in range(1, DEPTHS + 1)],
                                        *[cell(row["tau"][s], 2) for s in TAU_SIZES], said]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = []
    for item in args.runs:
        label, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"{item!r}: give each run as LABEL=RUN_DIR (e.g. 500k=runs/fh-500k)")
        rows.append(run_row(label, Path(path).expanduser()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": rows}, indent=1) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
