"""The thesis's recipe for prompt tokens, measured: an A/B of one training key (EPTs per prompt token, prompt tokens,
insertions per sequence, the decay ratio, KD against plain CE, the learning rate) on the same batches of the committed
corpus, online, every arm from the same seeded draw; held-out top-1 and top-5 at each distance every --eval-every
steps (docs/tools/draft_ab.py), beside the thesis's Table 6.4 (EPTs; Alpaca, Vicuna-7B, 20 steps) where it has one.

    .venv/bin/python docs/tools/ppd_recipe.py --vary num_epts=1,10 --steps 60     # ~1 h on 2 cores
    .venv/bin/python docs/tools/ppd_recipe.py --vary loss=kd,ce --steps 60

Writes docs/measurements/ppd-recipe-<key>.json (`--out`) as it goes. An arm of n EPTs feeds n times the rows per
insertion, so a run of large n on a CPU wants fewer insertions (--groups).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # draft_ab.py, beside this script
from draft_ab import ab_arguments, configure_logging, run_ab  # noqa: E402

from ppdkit.trainer.config import PromptTokenConfig, TrainConfig  # noqa: E402

MEASUREMENTS = Path(__file__).resolve().parents[1] / "measurements"
# PPD thesis Table 6.4: held-out accuracy by EPTs per prompt token, (@1 top-1, @1 top-5, @2 top-1, @2 top-5)
THESIS_EPTS = {100: (0.506, 0.794, 0.276, 0.602), 50: (0.502, 0.791, 0.281, 0.604), 20: (0.501, 0.791, 0.276, 0.607),
               10: (0.494, 0.786, 0.273, 0.600), 5: (0.499, 0.787, 0.265, 0.596), 2: (0.486, 0.777, 0.259, 0.583),
               1: (0.472, 0.771, 0.248, 0.576)}


def arms_of(vary: str) -> tuple[str, dict[str, dict]]:
    """KEY=V1,V2,... -> (the key, arm name -> its setting), each value read as the key's type says (an unknown key, or
    a value it refuses, fails here with the config's own message)."""
    key, _, values = vary.partition("=")
    if key not in PromptTokenConfig.model_fields or key == "method" or not values:
        raise SystemExit(f"--vary wants KEY=V1,V2 with KEY a train key of ept, not {vary!r}")
    arms = {}
    for value in values.split(","):
        setting = getattr(TrainConfig(method="ept", **{key: value}), key)  # validated and typed by the config
        arms[f"{key} {setting}"] = {key: setting}
    return key, arms


def main(argv: list[str] | None = None) -> int:
    p = ab_arguments(__doc__.splitlines()[0], MEASUREMENTS / "ppd-recipe.json", 60)
    p.add_argument("--vary", required=True, help="KEY=V1,V2,...: the train key the arms differ in")
    p.add_argument("--groups", type=int, default=16, help="insertion points a sequence (train.groups_per_sequence), "
                                                          "unless that is what varies")
    p.set_defaults(lr=0.01, batch=4, eval_every=20, eval_sequences=64)
    a = p.parse_args(argv)
    key, arms = arms_of(a.vary)
    if a.out == MEASUREMENTS / "ppd-recipe.json":
        a.out = MEASUREMENTS / f"ppd-recipe-{key.replace('_', '-')}.json"
    configure_logging()
    base = TrainConfig(method="ept", online=True, lr=a.lr, micro_batch=a.batch, groups_per_sequence=a.groups,
                       num_workers=1)
    report = run_ab(a, argv, "ppd_recipe.py", __doc__.splitlines()[0], arms, base_cfg=base)
    if key == "num_epts":
        import json

        report["thesis_table_6_4"] = {str(n): figures for n, figures in THESIS_EPTS.items()}
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
