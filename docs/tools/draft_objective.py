"""Does moving part of the target onto the teacher's top-1 help the EAGLE-3 draft? An A/B on the same batches: the
committed draft trained further with EAGLE-3's loss (the teacher's distribution, train.top1_share 0) against the
same draft with train.top1_share of each target moved onto the teacher's most likely token; then each arm on the
adoption gate's MT-Bench measure.

Greedy decoding keeps a draft's guess only where it is the base model's top-1; the distribution alone weighs that
token by its probability, so a draft with little capacity spends some of it on the tail. All arms start as the
committed draft and read the same batches (docs/tools/draft_ab.py); each arm's component is written to
--components, its tree values fitted and measured as `ppdkit adopt` measures a candidate (--measure-only: that
alone, on components an earlier run wrote, into its report):

    .venv/bin/python docs/tools/draft_objective.py --share 0.25 --share 0.5 --components ~/.cache/ppdkit/ab  # ~80 min, 2 cores
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # draft_ab.py, beside this script
from draft_ab import ab_arguments, configure_logging, gate_measures, run_ab  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "measurements" / "draft-objective.json"


def main(argv: list[str] | None = None) -> int:
    p = ab_arguments(__doc__.splitlines()[0], OUT, 240)
    p.add_argument("--share", type=float, action="append", help="train.top1_share of an arm (repeat for more; "
                   "default 0.5), beside the arm at 0")
    p.add_argument("--components", type=Path, required=True, help="where each arm's draft is written, by arm")
    p.add_argument("--measure-only", action="store_true", help="no training: measure the drafts in --components on "
                   "the gate and add that to the report in --out")
    a = p.parse_args(argv)
    configure_logging()
    if a.measure_only:
        report = json.loads(a.out.read_text())
    else:
        arms = {f"top1 share {share:g}": {"top1_share": share} for share in [0.0, *(a.share or [0.5])]}
        report = run_ab(a, argv, "draft_objective.py", __doc__.splitlines()[0], arms, components=a.components)
    a.out.write_text(json.dumps(gate_measures(report, a.components), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
