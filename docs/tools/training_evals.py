"""A training run's held-out evaluations as a committed report: per run, its top-1 (and top-10) at every token
distance at each evaluation step, read from the run's OUTPUT/train (its best and latest checkpoints' records), so a
model card shows how a draft learned from a report, not from prose.

    python docs/tools/training_evals.py --name eagle3-ppd-training \\
        --run "pairs and draft (the component)=RUN_DIR=ppdkit run ppdkit/jobs/configs/smollm2-eagle3-ppd.yaml" \\
        --run "pairs alone, draft frozen=RUN_DIR=ppdkit run ... train.freeze_draft=true"

Writes docs/measurements/NAME.json (kind `training-evals`, rendered by figure_blocks.py). A run's command is the one
that made it, as the user would type it: the run directory itself is not recorded (it names this machine).
"""

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from ppdkit.bench.decoding import machine_info

sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_blocks.py, beside this script
from figure_blocks import DOCS  # noqa: E402

COMMAND = "python docs/tools/training_evals.py"


def run_evals(run_dir: Path) -> tuple[list[dict], int]:
    """(each evaluation's step, top-1 and top-10 by distance), the held-out positions of one evaluation: from the
    run's record with the most evaluations, its best checkpoint's or a later one's (a run stopped early has no
    best after its last improvement)."""
    records = [run_dir / "train" / "best" / "meta.json", *(run_dir / "train" / "checkpoints").glob("step-*/meta.json")]
    meta = max((json.loads(path.read_text()) for path in records if path.is_file()), key=lambda m: len(m["evals"]))
    evals = []
    for e in meta["evals"]:
        depths = sorted(int(k.removeprefix("acc_top1_d")) for k in e if k.startswith("acc_top1_d"))
        evals.append({"step": e["step"], "top1": [round(e[f"acc_top1_d{d}"], 4) for d in depths],
                      "top10": [round(e[f"acc_top10_d{d}"], 4) for d in depths]})
    return evals, int(meta["evals"][0].get("eval_positions", 0))


def report(name: str, runs: list[tuple[str, Path, str]], eval_sequences: int, note: str | None) -> dict:
    """The report NAME of runs: (name in the table, run directory, the command that made it)."""
    out = []
    for label, run_dir, command in runs:
        evals, positions = run_evals(run_dir)
        out.append({"name": label, "command": command, "eval_positions": positions, "evals": evals})
    given = " ".join(f"--run '{label}=RUN_DIR={command}'" for label, _, command in runs)
    return {"kind": "training-evals", "command": f"{COMMAND} --name {name} {given}",
            "date": datetime.now(timezone.utc).date().isoformat(), "machine": machine_info(),
            "eval_sequences": eval_sequences, "runs": out, **({"note": note} if note else {})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="the report's name: docs/measurements/NAME.json")
    parser.add_argument("--run", action="append", required=True, metavar="NAME=RUN_DIR=COMMAND",
                        help="a run: its name in the table, its output directory, the command that made it")
    parser.add_argument("--eval-sequences", type=int, default=64, help="train.eval_sequences of the runs")
    parser.add_argument("--note", help="one hand-written line shown under the tables")
    args = parser.parse_args(argv)
    runs = []
    for given in args.run:
        name, run_dir, command = given.split("=", 2)
        if not (Path(run_dir) / "train" / "best" / "meta.json").is_file():
            parser.error(f"--run {given!r}: {run_dir} has no train/best/meta.json (a run's output directory)")
        runs.append((name, Path(run_dir), command))
    out = DOCS / "measurements" / f"{args.name}.json"
    out.write_text(json.dumps(report(args.name, runs, args.eval_sequences, args.note), indent=1) + "\n")
    print(f"wrote {out.relative_to(DOCS.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
