"""Tokens per step (tau) of the committed prompt tokens against the input rows a step feeds, the thesis's
hardware-independent figure (PPD thesis Table 6.1: tau 2.43 for MobileLLaMA with inputs of 40-285 rows, 2.54 for
Vicuna-7B with 40-105), on MT-Bench's 80 first turns, greedy, float32, 128 new tokens.

The component's trees of every size are built from its own calibrated acceptance table (trees.json, the calibrate
stage's), as the calibrate stage builds them. Sizes up to 84 rows are decoded (every size must give the same tokens);
a step of more rows is not bit for bit one-row steps on the native kernels (runtime/forward/row_invariance.py), so
there tau is the one a tree of that size expects from the acceptance measured on the same 80 answers (the ranks of
the model's next tokens among the guesses, as the calibrate stage measures them), which the decoded sizes check.
Beside: the tau the calibration expects, and the share of steps that kept at least 1, 2, 3 guesses (the
accumulated accuracy of thesis Figure 6.3, here of the whole tree).

    python docs/tools/ppd_tau.py [--model DIR] [--sizes 8,16,...] [--limit N]

Writes docs/measurements/ppd-tau.json (`--out`) and prints the table. It measures no time, so it may run beside
other work, only slower.
"""

import argparse
import json
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from ppdkit.bench.decoding import load_prompts, machine_info
from ppdkit.jobs.adopt import MEASURE, measure_component
from ppdkit.models.artifact import add_files, read_component
from ppdkit.runtime.decoding_methods import lookup_rows
from ppdkit.runtime.forward.fixed_shapes import ROWS as FIXED_ROWS
from ppdkit.runtime.trees.tree import best_tree_for_size

sys.path.insert(0, str(Path(__file__).resolve().parent))  # figure_blocks.py, beside this script
from figure_blocks import ROOT, ppd_tau_block  # noqa: E402

COMMAND = "python docs/tools/ppd_tau.py"
COMPONENT = ROOT / "ppdkit" / "models" / "components" / "smollm2-135m-ppd"
OUT = ROOT / "docs" / "measurements" / "ppd-tau.json"
SIZES = (8, 16, 32, 64, 80, 105, 285)
# the largest tree a decoder loads: its methods' steps (ppd-lookup's chains beside the tree) stay within the rows the
# native kernels verify bit for bit as one-row steps
LOSSLESS_ROWS = FIXED_ROWS - lookup_rows(1)
INSERTIONS = 64  # answer positions measured per MT-Bench answer
THESIS = {"MobileLLaMA": {"tau": 2.43, "rows": "40-285"}, "Vicuna-7B": {"tau": 2.54, "rows": "40-105"}}


def with_trees(component: Path, sizes: list[int], into: Path) -> Path:
    """A copy of `component` whose trees.json holds a tree of each size, built from its calibrated acceptance table."""
    shutil.copytree(component, into)
    calibrated = read_component(component).extras["trees"]
    epts = read_component(component).hyperparameters["num_epts"]
    trees = {str(size): best_tree_for_size(calibrated["acceptance"], size, epts).to_json() for size in sizes}
    add_files(into, json_files={"trees": {**calibrated, "trees": trees}})
    return into


def mt_bench_acceptance(component: Path, prompts: list[str], answers: list[list[int]], max_rank: int) -> list:
    """The acceptance table (calibrate.py's) of the prompt tokens on the base model's own greedy answers to
    `prompts`: at every answer position, the rank of the base's next tokens among their guesses at distances 1..k."""
    from ppdkit.models.loading import load_base_model
    from ppdkit.trainer.calibrate import acceptance_table, guess_ranks
    from ppdkit.trainer.online_teacher import OnlineTeacher

    base = load_base_model(read_component(component).base_model["name"], "none", MEASURE["dtype"])
    teacher = OnlineTeacher(base.model, top_k=8, keep_bytes=0)  # the targets' positions; the ranks are greedy's
    teacher.serve_targets_only()
    rows = []
    for prompt, answer in zip(prompts, answers):
        ids = base.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                                 add_generation_prompt=True, return_dict=False)
        rows.append({"input_ids": ids + answer, "loss_mask": [0] * len(ids) + [1] * len(answer)})
    ranks = guess_ranks(base.model, read_component(component), teacher.sequences(rows, "mt-bench"),
                        groups=INSERTIONS, micro_batch=4)
    return acceptance_table(ranks, max_rank)


def measure_tau(component: Path, sizes: list[int], limit: int | None = None) -> dict:
    prompts = load_prompts(MEASURE["prompts"], limit or MEASURE["limit"])
    calibrated = read_component(component).extras["trees"]
    epts = read_component(component).hyperparameters["num_epts"]
    rows, outputs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        sized = with_trees(component, [s for s in sizes if s <= LOSSLESS_ROWS], Path(tmp) / "component")
        expected = read_component(sized).extras["trees"]["trees"]
        for size in sizes:
            if size > LOSSLESS_ROWS:  # the verify kernels are row-invariant up to LOSSLESS_ROWS rows: estimated only
                rows.append({"rows": size})
                continue
            measured = measure_component(sized, prompts, {**MEASURE, "method": "ppd", "tree_size": size},
                                         label=f"ppd, {size} rows")
            outputs.append(measured.outputs)
            rows.append({"rows": size, "tau": round(measured.tokens_per_step, 4),
                         "expected_tau": round(expected[str(size)]["tau"], 4), "kept_share": measured.kept_share[:3]})
    # every size's tau as the thesis's trees would give it on these answers (the table measured on them), the
    # decoded sizes' beside their measured tau: how far the estimate is to be trusted at the larger ones
    on_answers = mt_bench_acceptance(component, prompts, outputs[0], len(calibrated["acceptance"][0]))
    for row in rows:
        row["mt_bench_expected_tau"] = round(best_tree_for_size(on_answers, row["rows"], epts).tau, 4)
    acceptance = calibrated["acceptance"]
    command = COMMAND + (f" --sizes {','.join(map(str, sizes))}" if tuple(sizes) != SIZES else "") + (
        f" --limit {limit}" if limit else "")  # the model by its name below: a path here could name this machine's
    return {"kind": "ppd-tau", "command": command, "model": component.name,
            "lossless_rows": LOSSLESS_ROWS, "hyperparameters": read_component(component).hyperparameters,
            "run": read_component(component).run, "prompts": len(prompts),
            "measure": {k: v for k, v in MEASURE.items() if k not in ("method", "limit", "tree_size")},
            "calibrated_on": {k: calibrated.get(k) for k in ("split", "sequences", "insertions")},
            "top1_by_distance": [round(d[0], 4) for d in acceptance],
            "top10_by_distance": [round(sum(d[:10]), 4) for d in acceptance],
            "mt_bench_top1_by_distance": [round(d[0], 4) for d in on_answers],
            "mt_bench_top10_by_distance": [round(sum(d[:10]), 4) for d in on_answers],
            "identical": sum(all(o[i] == outputs[0][i] for o in outputs) for i in range(len(prompts))),
            "thesis": THESIS, "machine": machine_info(), "date": datetime.now(timezone.utc).date().isoformat(),
            "sizes": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(COMPONENT), help="a PPD component (ept or ept-head) with trees.json")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="input rows a step feeds, comma-separated")
    parser.add_argument("--limit", type=int, default=None, help="fewer prompts than the measure's (a quick look)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    report = measure_tau(Path(args.model), [int(s) for s in args.sizes.split(",")], args.limit)
    if report["identical"] != report["prompts"]:
        print(f"tree sizes gave other tokens on {report['prompts'] - report['identical']} prompts: decoding is not "
              "lossless; report this", file=sys.stderr)
        return 1
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(ppd_tau_block(Path(args.out).stem, report, "docs/")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
