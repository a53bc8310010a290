"""docs/corpus.md: the self-distilled corpus, online training and the continual recipe, generated from what is
committed. The page reads:
- the corpus's manifest (ppdkit/data_pipeline/corpora/smollm2-135m/corpus.json), for its mix;
- the online-training measurements (docs/measurements/online-training-*.json);
- the committed EAGLE-3 draft's history (ppdkit/models/components/smollm2-135m-eagle3/history.json), which is the
  data-scaling table: corpus tokens, positions trained, held-out top-1 and MT-Bench tokens per step;
- the gate's measure on held-out corpus prompts against MT-Bench (docs/measurements/draft-gap.json, written by
  docs/tools/draft_gap.py);
- the A/B of a second draft layer (docs/measurements/draft-layers.json, written by docs/tools/draft_layers.py);
- the A/B of the training target with part of it on the teacher's top-1 (docs/measurements/draft-objective.json,
  written by docs/tools/draft_objective.py);
- the gate's measure with the corpus's own chain in the tree (docs/measurements/corpus-chain.json, written by
  docs/tools/corpus_chain.py);
- the gate's measure with the trees valued by the draft's own probabilities and by the fitted value model
  (docs/measurements/tree-values.json, written by docs/tools/fitted_values.py);
- the history again, as the cost curve of docs/tools/draft_curve.py, at the training speeds the reports measured
  (drawn into docs/images/draft-scaling.png when the page is written).

    .venv/bin/python docs/tools/corpus_page.py           # after the corpus grew or a draft was adopted
    .venv/bin/python docs/tools/corpus_page.py --check   # exit 1 when the committed page is out of date
"""

import json
import sys
from pathlib import Path

from ppdkit.data_pipeline.corpus import committed_corpus, open_corpus
from ppdkit.jobs.adopt import MEASURE, format_shares, history_table, measure_for

sys.path.insert(0, str(Path(__file__).resolve().parent))  # page_check.py and draft_gap.py, beside this script
from corpus_chain import chain_table  # noqa: E402
from draft_curve import draw, section  # noqa: E402
from draft_gap import gap_table  # noqa: E402
from fitted_values import values_table  # noqa: E402
from page_check import page_main  # noqa: E402
from results_page import DIGEST_KEY, plot_is_current, report_digest  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "corpus.md"
COMMAND = "python docs/tools/corpus_page.py"
BASE = "smollm2-135m"
COMPONENT = ROOT / "ppdkit" / "models" / "components" / "smollm2-135m-eagle3"
PROMPT_COMPONENT = ROOT / "ppdkit" / "models" / "components" / "smollm2-135m-ppd"
MEASUREMENTS = ROOT / "docs" / "measurements"
RECIPE = ROOT / "ppdkit" / "jobs" / "configs" / "smollm2-eagle3-continual.yaml"
CURVE = ROOT / "docs" / "images" / "draft-scaling.png"


def mix_table(corpus) -> str:
    figures = corpus.figures()
    skipped: dict[str, dict[str, int]] = {}
    for shard in corpus.shards:
        for reason, n in shard["skipped"].items():
            entry = skipped.setdefault(shard["source"], {})
            entry[reason] = entry.get(reason, 0) + n
    lines = ["| source | conversations | tokens | share | written by the model | rows left out |",
             "|---|---|---|---|---|---|"]
    for source, entry in figures["by_source"].items():
        left = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.get(source, {}).items())) or "-"
        lines.append(f"| {source} | {entry['rows']:,} | {entry['tokens']:,} | "
                     f"{entry['tokens'] / max(figures['tokens'], 1):.1%} | {entry['answer_tokens']:,} | {left} |")
    lines.append(f"| **all** | **{figures['rows']:,}** | **{figures['tokens']:,}** | 100% | "
                 f"{figures['answer_tokens']:,} | |")
    return (f"{figures['shards']} shards, {figures['bytes'] / 1e6:.1f} MB on disk ({figures['bytes_per_token']:.2f} "
            "bytes a token):\n\n" + "\n".join(lines) + "\n")


def online_table(path: Path) -> str:
    report = json.loads(path.read_text())
    rows = [("one worker, 1 thread", report["one_worker_1_thread"]["results"]),
            ("one worker, 2 threads", report["one_worker_2_threads"]["results"])]
    two = report["two_workers_1_thread_each"]
    lines = ["| workers | precomputed (a teacher cache), positions/s | online, positions/s | online's share |",
             "|---|---|---|---|"]
    for label, (pre, online) in rows:
        lines.append(f"| {label} | {pre['positions_per_second']:.0f} | {online['positions_per_second']:.0f} | "
                     f"{online['positions_per_second'] / pre['positions_per_second']:.2f} |")
    lines.append(f"| two workers, 1 thread each | {two['precomputed_positions_per_second']:.0f} | "
                 f"{two['online_positions_per_second']:.0f} | "
                 f"{two['online_positions_per_second'] / two['precomputed_positions_per_second']:.2f} |")
    return (f"{report['cpu']}, {report['date']} ([{path.name}](measurements/{path.name})): {report['what']}.\n\n"
            + "\n".join(lines) + "\n")


def gap_section(report: dict) -> str:
    """The gate's measure on held-out corpus prompts beside MT-Bench's (docs/tools/draft_gap.py)."""
    top1 = format_shares(report["heldout_top1"])
    runs = report.get("trained_runs_left_out") or []
    left_out = (f" Rows that an earlier run of the draft's lineage trained on ({', '.join(runs)}) are left out." if runs
                else "")
    return ("## Where the draft stops: held-out corpus prompts against MT-Bench\n\n"
            f"The gate's measure for the draft of run `{report['run']}` (held-out top-1 at distances 1-4: {top1}) on "
            "MT-Bench first turns and on the first turns of that run's held-out corpus conversations, by source "
            f"({report['date']}, [draft-gap.json](measurements/draft-gap.json), `python docs/tools/draft_gap.py`). "
            "Where the held-out rows keep many more guesses than MT-Bench, the prompts are what the draft lacks; "
            "where they keep about as many, it is the draft itself, and more of the same data gives what the "
            "data-scaling table above shows." + left_out + "\n\n" + gap_table(report))


def layers_section(report: dict) -> str:
    """The A/B of a one-layer against a two-layer draft on the same batches (docs/tools/draft_layers.py)."""
    s = report["settings"]
    lines = ["| step | answer positions read | one layer: top-1 d1-4 | two layers: top-1 d1-4 |", "|---|---|---|---|"]
    lines += [f"| {e['step']} | {e['positions']:,} | {format_shares(e['one layer'])} | "
              f"{format_shares(e['two layers'])} |" for e in report["evals"]]
    seconds = report["train_seconds"]
    last = report["evals"][-1]
    gain = [b - a for a, b in zip(last["one layer"], last["two layers"])]
    start = report["evals"][0]["one layer"][0]
    low = min(e["one layer"][0] for e in report["evals"]) - start
    return ("## A second draft layer\n\n"
            f"Both arms start from the committed draft ({report['started_from']}); the second layer starts as the "
            f"identity, so step 0 is the same for both. {s['steps']} steps of {s['batch']} corpus conversations, lr "
            f"{s['lr']} cosine, the training-time test {s['depth']} steps deep, held-out top-1 on "
            f"{report['heldout_sequences']} held-out conversations ({report['date'][:10]}, {report['machine']['cpu']}, "
            "[draft-layers.json](measurements/draft-layers.json), `python docs/tools/draft_layers.py`):\n\n"
            + "\n".join(lines) + "\n\n"
            f"At the end the second layer changed top-1 by {'/'.join(f'{g:+.4f}' for g in gain)} at distances "
            f"1-{len(gain)}, and it cost {seconds['two layers'] / seconds['one layer']:.2f}x the one-layer arm's "
            "training time (the base's forward left out). The one-layer arm's top-1 at distance 1 was at its lowest "
            f"{low:+.4f} from its start and ended {last['one layer'][0] - start:+.4f} from it: a continual run from a "
            "fresh AdamW state at full lr loses first what it then wins back (train.warmup_steps is there to try "
            "against that).")


def objective_section(report: dict) -> str:
    """The A/B of train.top1_share on the same batches, then on the gate (docs/tools/draft_objective.py)."""
    s, arms, last = report["settings"], list(report["arms"]), report["evals"][-1]
    lines = ["| step | answer positions read | " + " | ".join(f"{a}: top-1 d1-4" for a in arms) + " |",
             "|---|---|" + "---|" * len(arms)]
    lines += [f"| {e['step']} | {e['positions']:,} | " + " | ".join(format_shares(e[a]) for a in arms) + " |"
              for e in report["evals"]]
    gate = report["gate"]
    ends = ["| arm | held-out top-1 d1-4 | held-out top-5 d1-4 | MT-Bench tokens per step | steps keeping at least "
            "1/2/3/4/5 guesses |", "|---|---|---|---|---|"]
    ends += [f"| {a} | {format_shares(last[a])} | {format_shares(last['top5'][a])} | "
             f"{gate[a]['tokens_per_step']:.3f} | {format_shares(gate[a]['kept_share'])} |" for a in arms]
    control = arms[0]
    gains = ", ".join(f"{a} {gate[a]['tokens_per_step'] - gate[control]['tokens_per_step']:+.3f} tokens per step "
                      f"(top-1 d1 {last[a][0] - last[control][0]:+.4f})" for a in arms[1:])
    measure = gate["measure"]
    return ("## The training target: the teacher's top-1\n\n"
            "Greedy decoding keeps a guess only where it is the base model's top-1, and EAGLE-3's loss weighs that "
            "token by its probability. `train.top1_share` moves that share of each target onto the teacher's top-1. "
            f"All arms start from the committed draft ({report['started_from']}) and read the same batches: "
            f"{s['steps']} steps of {s['batch']} corpus conversations, lr {s['lr']} cosine, {s['precision']}, the "
            f"training-time test {s['depth']} steps deep, held-out top-1 on {report['heldout_sequences']} held-out "
            f"conversations ({report['date'][:10]}, {report['machine']['cpu']}, "
            "[draft-objective.json](measurements/draft-objective.json), `python docs/tools/draft_objective.py`):\n\n"
            + "\n".join(lines) + "\n\n"
            f"Then each arm's tree values were fitted and it was measured as `ppdkit adopt` measures a candidate "
            f"(`{measure['method']}`, trees of {measure['tree_size']} nodes, {measure['limit']} {measure['prompts']} "
            f"first turns, {measure['dtype']}); all arms gave the same tokens on {report['identical']} of "
            f"{measure['limit']} prompts:\n\n" + "\n".join(ends) + "\n\n"
            f"Against the arm at 0 (EAGLE-3's loss), on the same batches: {gains}. The continual recipe "
            f"([{RECIPE.name}](../{RECIPE.relative_to(ROOT).as_posix()})) trains with top1_share "
            f"{recipe_top1_share()}.")


def recipe_top1_share() -> float:
    """train.top1_share of the continual recipe, read as `ppdkit run` reads it (its default where it sets none)."""
    from ppdkit.jobs.spec import load_spec

    return load_spec(RECIPE).train.top1_share


def chain_section(report: dict) -> str:
    """The gate's measure with eagle3-anpd and with eagle3-corpus (docs/tools/corpus_chain.py)."""
    before, after = (m["tokens_per_step"] for m in report["methods"].values())
    return ("## The corpus as a drafter: eagle3-corpus\n\n"
            "The corpus also drafts: `eagle3-corpus` merges into the draft's tree a chain of what most often followed "
            f"the text's longest ending (up to {report['max_n']} tokens) in the corpus "
            "([docs/methods.md](methods.md#eagle3-eagle3-anpd-eagle3-corpus)). The gate's measure of the committed draft with and without "
            f"it, the corpus at {report['corpus_tokens'] / 1e6:.2f}M tokens ({report['date']}, "
            f"{report['machine']['cpu']}, [corpus-chain.json](measurements/corpus-chain.json), "
            f"`python docs/tools/corpus_chain.py`); both gave the same tokens on {report['identical']} of "
            f"{report['prompts']} prompts:\n\n" + chain_table(report) + "\n"
            f"The same draft keeps {after - before:+.3f} tokens per step more with the corpus's chain, with no "
            "training: the corpus pays twice, as the draft's training data and as a drafter of its own.")


def values_section(report: dict) -> str:
    """The gate's measure with the draft's own values and the fitted ones (docs/tools/fitted_values.py)."""
    fitted = report["fitted"]
    gains = ", ".join(f"`{name}` {m['fitted']['tokens_per_step'] - m['own']['tokens_per_step']:+.3f}"
                      for name, m in report["methods"].items())
    return ("## Fitted tree values\n\n"
            "A grown tree takes the guesses most likely to be the base model's tokens. The draft's probability says "
            "how likely the base model is to *write* a token, not how likely it is to be its greedy choice, and "
            "where the draft and a chain agree, neither alone says how much that is worth. The component's "
            "`tree_values.json` holds a logistic model of both, with the guess's depth by source and what the draft "
            "said of its parent, fitted by `ppdkit fit-tree-values` on "
            f"{fitted['prompts']} held-out corpus first turns ({fitted['candidates']:,} candidates of "
            f"{fitted['steps']:,} steps; the corpus chain reads tables without those conversations, and MT-Bench is "
            "never read; [docs/methods.md](methods.md#eagle3-eagle3-anpd-eagle3-corpus)). The gate's measure of the committed draft "
            f"both ways ({report['date']}, {report['machine']['cpu']}, [tree-values.json](measurements/tree-values.json), "
            f"`python docs/tools/fitted_values.py`); all four gave the same tokens on {report['identical']} of "
            f"{report['prompts']} prompts:\n\n" + values_table(report) + "\n"
            f"The same draft and corpus keep {gains} tokens per step with the fitted values, with no training.")


def history_rows(component: Path = COMPONENT) -> list[dict]:
    path = component / "history.json"
    return json.loads(path.read_text())["rows"] if path.is_file() else []


def training_rates() -> dict[str, float]:
    """Online EAGLE-3 training speeds the committed reports measured: label -> positions per second."""
    rates = {}
    for path in sorted(MEASUREMENTS.glob("online-training-*.json")):
        report = json.loads(path.read_text())
        rates[f"two CPU workers online, {report['cpu']} ([{path.name}](measurements/{path.name}))"] = \
            report["two_workers_1_thread_each"]["online_positions_per_second"]
    for path in sorted(MEASUREMENTS.glob("gpu-lane-*.json")):
        report = json.loads(path.read_text())
        rates[f"the GPU lane, {report['machine']['gpu']} ([{path.name}](measurements/{path.name}))"] = \
            report["stages"]["train"]["positions_per_second"]
    return rates


def render() -> str:
    corpus = open_corpus(committed_corpus(BASE))
    history = history_rows()
    measure = ", ".join(f"{k} {v}" for k, v in MEASURE.items())
    parts = [
        "# The corpus, online training and continual training",
        "",
        "<!-- generated by docs/tools/corpus_page.py from the committed corpus, docs/measurements and the draft's "
        "history: edit those, then run it -->",
        "",
        "A draft is trained on the base model's own conversations, so that it learns to guess what the model will "
        "write. They are kept in a corpus committed with ppdkit ([its README](../ppdkit/data_pipeline/corpora/smollm2-135m/"
        "README.md)), and grown by `ppdkit corpus grow` in the background of every working session. Training reads the "
        "corpus with `data.source: corpus`. With `train.online: true` the frozen base computes the targets and hidden "
        "states in the training step, so a machine keeps nothing but the corpus and the checkpoints. `ppdkit adopt` "
        "then replaces the committed draft only when the new one does better "
        "([ppdkit/jobs/configs/smollm2-eagle3-continual.yaml](../ppdkit/jobs/configs/smollm2-eagle3-continual.yaml) has the "
        "commands).",
        "",
        f"## The SmolLM2 corpus's mix ({corpus.manifest['base_model']})",
        "",
        mix_table(corpus),
        "Rows left out are counted by reason in each shard's record in `corpus.json`. A copy of a benchmark prompt "
        "is never trained on (ppdkit/data_pipeline/contamination.py).",
        "",
        "## Online against precomputed targets",
        "",
    ]
    for path in sorted(MEASUREMENTS.glob("online-training-*.json")):
        parts += [online_table(path)]
    parts += [
        "Online, every sequence costs the base's forward in the step, so a step costs about twice what it costs on "
        "a teacher cache. In exchange, no teacher stage runs first and nothing is stored (the last teacher cache with "
        "its states took 17 GB and 5 hours, and was lost with its machine). Results are kept in memory up to 2 GB a "
        "worker, so while a corpus fits, the epochs after the first cost what a cache costs.",
        "",
        "## The committed draft's history: the data-scaling table",
        "",
        f"Each candidate against the committed draft on one fixed measure ({measure}), with the held-out top-1 "
        "accuracy at distances 1-4 of the run that trained it (step 0 is the committed draft it started from) and, "
        "on the measure's own steps, the share that kept at least 1, 2 and 3 guesses.",
        "",
        history_table(history) if history else "No candidate has been measured yet.\n",
    ]
    parts += ["", section(history, training_rates(), CURVE.relative_to(ROOT / "docs").as_posix())]
    prompt_history = history_rows(PROMPT_COMPONENT)
    if prompt_history:
        ppd = measure_for("ept")
        parts += ["", "## The committed prompt tokens' history", "",
                  "The prompt tokens train on the same corpus, online, from the committed ones "
                  "([ppdkit/jobs/configs/smollm2-ppd-continual.yaml](../ppdkit/jobs/configs/smollm2-ppd-continual.yaml), "
                  "run in the background of every session by `infra/continual/ppd.sh`), and `ppdkit adopt` keeps a "
                  f"candidate only if it keeps more tokens a step on its measure (`{ppd['method']}` on the calibrated "
                  f"tree of {ppd['tree_size']} input rows, the rest as above), with the held-out top-1 at distances "
                  "1-3 of the run that trained it.", "", history_table(prompt_history)]
    chain = MEASUREMENTS / "corpus-chain.json"
    if chain.is_file():
        parts += ["", chain_section(json.loads(chain.read_text()))]
    values = MEASUREMENTS / "tree-values.json"
    if values.is_file():
        parts += ["", values_section(json.loads(values.read_text()))]
    layers = MEASUREMENTS / "draft-layers.json"
    if layers.is_file():
        parts += ["", layers_section(json.loads(layers.read_text()))]
    objective = MEASUREMENTS / "draft-objective.json"
    if objective.is_file():
        parts += ["", objective_section(json.loads(objective.read_text()))]
    gap = MEASUREMENTS / "draft-gap.json"
    if gap.is_file():
        parts += ["", gap_section(json.loads(gap.read_text()))]
    return "\n".join(parts).rstrip("\n") + "\n"


def curve_picture(check: bool) -> list[str]:
    """The cost curve's picture, drawn again when it does not show the committed history (the results page's
    digest in its metadata); with `check`, only said to be out of date."""
    history = {"rows": history_rows()}
    if plot_is_current(CURVE, history):
        return []
    if not check:
        draw(history["rows"], CURVE, {DIGEST_KEY: report_digest(history)})
    return [str(CURVE.relative_to(ROOT))]


def main(argv: list[str] | None = None) -> int:
    return page_main(argv, __doc__, OUT, render, COMMAND, ROOT, curve_picture)


if __name__ == "__main__":
    sys.exit(main())
