"""Put a committed report's figures into the hand-written pages, and keep measured figures out of their prose.

A page (README.md, docs/*.md or a committed component's model card, ppdkit/models/components/*/README.md) asks for a
report's figures with a marked block; this tool writes what is between the marks from the report, with the date,
machine and command it was measured with (its links relative to the page's folder):

    <!-- figures: results/epyc-eagle3-mt-bench-80 -->
    (written by this tool: do not edit)
    <!-- /figures -->

The name is the report's path under docs/ without `.json`: a bench report (docs/results/NAME.json, what
`ppdkit bench --out` writes), a step-cost report (docs/measurements/step-costs*.json, docs/tools/step_costs.py), a
precision report (docs/measurements/precision*.json, `ppdkit precision`), a serving-load report
(docs/measurements/serve-load*.json, `ppdkit serve-bench --out`), a cluster-throughput report
(docs/measurements/cluster-throughput*.json, `infra/ray/cluster_throughput.py --out`), a GPU lane's report
(docs/measurements/gpu-lane*.json, the lane.json `python -m ppdkit.jobs.gpu_lane` writes), a draft-arms report
(docs/measurements/draft-blocks*.json and draft-grow*.json, docs/tools/draft_blocks.py), a tau-by-rows report
(docs/measurements/ppd-tau*.json, docs/tools/ppd_tau.py) or the history
(docs/measurements/history.json, figures transcribed from the pages before they had reports).

    .venv/bin/python docs/tools/figure_blocks.py           # rewrite every block from its report
    .venv/bin/python docs/tools/figure_blocks.py --check   # exit 1 when a block differs from its report, or when a
                                                            # page states a measured figure outside a block

The lint (`measured_figures`) is why a figure cannot drift from its report: speeds, ratios to `ar`, tokens per step,
acceptance rates, dated measurements and measurement tables are found outside blocks and code, and refused. A model
card's `ppdkit adopt` history table (ppdkit/jobs/adopt.py, from the component's history.json) is such a block too: the
check holds it to what adopt writes from that history.
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path

from ppdkit.bench.decoding import describe_commit, describe_machine
from ppdkit.jobs import adopt

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The committed components' model cards, each ppdkit/models/components/NAME/README.md.
COMPONENTS = Path("ppdkit") / "models" / "components"
COMMAND = "python docs/tools/figure_blocks.py"
# Pages another tool writes whole from its own reports: results.md, job-spec.md, corpus.md.
GENERATED_PAGES = {"results.md", "job-spec.md", "corpus.md"}

BLOCK = re.compile(r"(?P<open><!-- figures: (?P<name>[\w./-]+) -->\n)(?P<body>.*?)(?P<close><!-- /figures -->)", re.S)
# The history table `ppdkit adopt` writes into a component's model card from its history.json.
ADOPT_BLOCK = re.compile(re.escape(adopt.BEGIN) + r"\n(?P<body>.*?)" + re.escape(adopt.END), re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)

# What counts as a measured figure in prose. Each pattern names the kind of figure the issue means; sizes of models,
# settings and line counts carry none of these units.
MEASURED = {
    "a speed": re.compile(r"\d[\d,.]*\s*(?:tok/s|tokens/s|tokens a second|tokens per second|positions/s|"
                          r"positions per second|ms a token|ms a step|ms per step|GB/s|GMAC/s)"),
    "a ratio": re.compile(r"\b\d+(?:\.\d+)?x\b(?![\d-])"),
    "tokens per step": re.compile(r"\d+(?:\.\d+)?\s*(?:tok/step|tokens/step|tokens per step|tokens a step)"),
    "an acceptance rate": re.compile(r"(?:acceptance|accepted|top-1|top-5|kept)\s+(?:of\s+)?\.\d{2}"
                                     r"|\b\d+(?:\.\d+)?%\s+(?:of\s+(?:the\s+)?(?:steps|rows|positions|prompts)|"
                                     r"less|more|fewer|faster|slower)"),
    "a dated measurement": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
}
# A table whose header names one of these columns is a table of measurements.
MEASURED_COLUMN = re.compile(r"\|\s*(?:[^|]*\b)?(?:x ar|x `ar`|tok/s|tok/step|tokens/step|tokens per step|top-1|"
                             r"latency|ms)\b[^|]*\|")


# --- rendering a report ---------------------------------------------------------------------------------------------

def provenance(report: dict, tool: str) -> str:
    """The line every block opens with: when, on what, by which command (the report's own, else the tool that
    writes such reports, said to be only that)."""
    machine = describe_machine(report["machine"]) if isinstance(report.get("machine"), dict) else "machine not recorded"
    at = describe_commit(report["machine"]) if isinstance(report.get("machine"), dict) else ""
    command = f"`{report['command']}`" if report.get("command") else f"command not recorded; written by `{tool}`"
    return f"Measured {report.get('date', '(date not recorded)')[:10]} on {machine}{at}; {command}."


def _ratio(row: dict, key: str) -> str:
    return f"{row[key]:.2f}" if row.get(key) is not None else "-"


def bench_block(name: str, report: dict, docs_link: str) -> list[str]:
    """A bench report as one table: its methods' speed, ratio to `ar`, tokens per step and identical outputs."""
    prompts = report["results"][0]["prompts"] if report["results"] else 0
    lines = [provenance(report, "ppdkit bench --out"), "",
             f"{prompts} {report['prompts_source']} prompts, {report['max_new_tokens']} new tokens, weights "
             f"{report.get('dtype', 'float32')}; the whole report: [{name}]({docs_link}results.md#{name}).", "",
             "| method | tok/s | x ar | tok/step | identical (to) |", "|---|---:|---:|---:|---:|"]
    for row in report["results"]:
        same = round(row["identical_to_greedy"] * row["prompts"])
        lines.append(f"| `{row['method']}` | {row['tokens_per_s']:.1f} | {_ratio(row, 'speedup_vs_ar')} | "
                     f"{row['mean_accepted_per_step']:.2f} | {same}/{row['prompts']} "
                     f"({row.get('compared_with', 'hf-greedy')}) |")
    return lines


def step_cost_block(name: str, report: dict, docs_link: str) -> list[str]:
    """A step-cost report: ms of one forward by the rows it feeds, per weight format and kernel, and the machine's
    read bandwidth (reading the weights once is the one-row step's floor)."""
    rows = list(next(iter(report["dtypes"].values()))["latency_ms"])
    lines = [provenance(report, "python docs/tools/step_costs.py"), "",
             f"{report['base']}, {report['context']} cached tokens, read bandwidth "
             f"{report['read_bytes_per_s'] / 1e9:.1f} GB/s ([report]({docs_link}measurements/{name}.json)).", "",
             "| rows | " + " | ".join(rows) + " |", "|---|" + "---:|" * len(rows)]
    for dtype, costs in report["dtypes"].items():
        lines.append(f"| {dtype} ms | " + " | ".join(f"{costs['latency_ms'][r]:.1f}" for r in rows) + " |")
    gguf = report["dtypes"].get("gguf")
    if gguf and "roofline_ms" in gguf:  # the 4-bit blocks' floor: their read, or their int8 work at the kernel's rate
        lines.append("| gguf roofline ms | " + " | ".join(f"{gguf['roofline_ms'][r]:.1f}" for r in rows) + " |")
    llama = report.get("llama_cpp")
    if llama:  # llama-bench's pp n: n rows over an empty context
        lines.append("| llama.cpp pp ms | " + " | ".join(f"{llama['latency_ms'][r]:.1f}" if r in llama["latency_ms"]
                                                        else "-" for r in rows) + " |")
        lines += ["", f"llama.cpp's own tg128 step on the same file: {llama['tg128_ms']:.1f} ms a token "
                      f"(build {llama['build']})."]
    return lines


def precision_block(name: str, report: dict, docs_link: str) -> list[str]:
    """A precision report: how many greedy answers a format leaves unchanged, and its perplexity."""
    reference, other = report["dtypes"]
    perplexity = report["perplexity"]
    return [provenance(report, "ppdkit precision"), "",
            f"{report['equal']} of {report['prompts']} {report['prompts_source']} greedy answers "
            f"({report['max_new_tokens']} tokens) in {other} equal {reference}'s; the others first differ at token "
            f"{report['first_difference_min']} at the earliest, {report['first_difference_median']} at the median. "
            f"Perplexity on {report['texts']} {report['texts_source']} texts ({report['text_tokens']:,} tokens): "
            f"{reference} {perplexity[reference]:.3f}, {other} {perplexity[other]:.3f} "
            f"([report]({docs_link}measurements/{name}.json))."]


def _figure(value, spec: str) -> str:
    return format(value, spec) if value is not None else "-"


def note_lines(report: dict) -> list[str]:
    """A report's hand-written note, after a blank line, where it has one."""
    return ["", f"Note: {report['note']}"] if report.get("note") else []


def serving_load_block(name: str, report: dict, docs_link: str) -> list[str]:
    """A serving-load report: per server and number of concurrent clients, total tokens/s, time to first token and
    per-token latency (p50/p99), request latency, the server's peak memory and the answers equal to its own at 1
    client; a drafting server's answers against its plain twin's; then the servers that did not run, and why."""
    lines = [provenance(report, "ppdkit serve-bench --out"), "",
             f"{report['prompts']} {report['prompts_source']} prompts, {report['max_tokens']} tokens a request, greedy, "
             f"streamed; `ppdkit serve` ran `{report['source']}` with `{report['method']}`; per-token latency "
             f"{report['per_token_latency']} ([report]({docs_link}measurements/{name}.json)).", "",
             "| server | clients | tok/s | TTFT p50 ms | TTFT p99 ms | per-token p50 ms | per-token p99 ms | "
             "request p50 s | peak RSS MiB | identical |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for server in report["servers"]:
        for row in server.get("levels", []):
            lines.append(f"| `{server['name']}` | {row['clients']} | {row['tokens_per_s']:.1f} | "
                         f"{_figure(row['ttft_ms_p50'], '.0f')} | {_figure(row['ttft_ms_p99'], '.0f')} | "
                         f"{_figure(row['tpot_ms_p50'], '.1f')} | {_figure(row['tpot_ms_p99'], '.1f')} | "
                         f"{_figure(row['latency_s_p50'], '.2f')} | {row['peak_rss_mib']:.0f} | "
                         f"{row['identical']}/{row['requests']} |")
    started = [f"`{s['name']}` {s['startup_s']:.0f} s" for s in report["servers"] if s["status"] == "ran"]
    alone = report.get("decode_alone")
    ppdkit = next((s for s in report["servers"] if s["name"] == "ppdkit" and s["status"] == "ran"), None)
    if alone and ppdkit:  # what one client through the server is held to: `ppdkit decode` on the same prompts
        one = ppdkit["levels"][0]
        lines += ["", f"`ppdkit decode` alone on the same prompts ({alone['method']}): {alone['tokens_per_s']:.1f} "
                      f"tok/s, {alone['tokens_per_step']:.2f} tokens per step; `ppdkit serve` at 1 client "
                      f"{one['tokens_per_s'] / alone['tokens_per_s']:.2f}x of it, its answers equal to decode's: "
                      f"{ppdkit['same_as_decode']}/{one['requests']}."]
    if ppdkit:  # what batching gave over one stream, and what it cost each request's latency
        one = ppdkit["levels"][0]
        lines += ["", "`ppdkit serve` against its own 1 client: " + "; ".join(
            f"{row['clients']} clients {row['tokens_per_s'] / one['tokens_per_s']:.2f}x the tokens/s, request p50 "
            f"{row['latency_s_p50'] / one['latency_s_p50']:.1f}x" for row in ppdkit["levels"][1:]) + "."]
    twins = [f"`{s['name']}`'s answers at 1 client equal to `{s['same_as_plain']['server']}`'s (the same server "
             f"without the draft): {s['same_as_plain']['equal']}/{s['same_as_plain']['compared']}"
             for s in report["servers"] if "same_as_plain" in s]
    if twins:
        lines += ["", "; ".join(twins) + "."]
    not_run = [f"`{s['name']}` {s['status']} ({s['reason']})" for s in report["servers"] if s["status"] != "ran"]
    return lines + ([""] + [f"Started in: {', '.join(started)}."] if started else []) + (
        [f"Not run: {'; '.join(not_run)}."] if not_run else []) + note_lines(report)


def cluster_throughput_block(name: str, report: dict, docs_link: str) -> list[str]:
    """A cluster-throughput report: the teacher's and training's positions per second in each cluster shape on the
    same cores, the all-reduce of the trainable gradients where the ranks were, and an object got across nodes."""
    lines = [provenance(report, "python infra/ray/cluster_throughput.py --out"), "",
             f"`{report['spec']}` on `{report['base_model']}` ({report['quantization']}), overrides "
             f"`{' '.join(report['overrides'])}`: the teacher stage on two actors and training on two DeepSpeed ranks "
             f"(gloo), 1 CPU each, in each shape of one machine's cores "
             f"([report]({docs_link}measurements/{name}.json)).",
             "", "| shape | teacher positions/s | teacher actors' start s | training positions/s | ranks on the head | "
             "all-reduce of the gradients (bytes) ms |", "|---|---:|---:|---:|---:|---:|"]
    for shape in report["shapes"]:
        reduce = shape["train"]["allreduce"]
        lines.append(f"| {shape['shape']} | {shape['teacher']['positions_per_s']:.0f} | "
                     f"{shape['teacher']['startup_s']:.1f} | {shape['train']['positions_per_s']:.1f} | "
                     f"{shape['train']['ranks_on_head']} | "
                     f"({reduce['bytes']}) {reduce['median_ms']:.2f} |")
    one, *more = report["shapes"]
    for shape in more:
        lines += ["", f"{shape['shape']} against {one['shape']}: teacher "
                      f"{shape['teacher']['positions_per_s'] / one['teacher']['positions_per_s']:.2f}x, training "
                      f"{shape['train']['positions_per_s'] / one['train']['positions_per_s']:.2f}x."]
        moved = shape.get("object_store_s")
        if moved:
            lines += ["", f"The object store: a {report['object_bytes'] / 2**20:.0f} MiB object the driver put, got by "
                          f"a task on the head in {1000 * moved['head']:.0f} ms and on the worker node in "
                          f"{1000 * moved['worker']:.0f} ms (median of {report.get('repeats', 5)})."]
    return lines


def gpu_lane_block(name: str, report: dict, docs_link: str) -> list[str]:
    """A GPU lane's report (ppdkit/jobs/gpu_lane.py): what each stage made, in how long, and held-out top-1 before
    and after its training; a failed stage by its error."""
    stages = report["stages"]
    lines = [provenance(report, "python -m ppdkit.jobs.gpu_lane"), "",
             f"The lane's report: [{name}]({docs_link}measurements/{name}.json).", "",
             "| stage | made | seconds | rate |", "|---|---|---:|---:|"]
    grown, trained = stages.get("corpus", {}), stages.get("train", {})
    if grown.get("ok"):
        lines.append(f"| corpus | {grown['rows']:,} conversations in {grown['shards_written']} shard{'s' if grown['shards_written'] != 1 else ''}, "
                     f"{grown['tokens']:,} tokens ({grown['generated_tokens']:,} written by the model) | "
                     f"{grown['seconds']:.0f} | {grown['generated_tokens_per_s']:,.0f} generated tok/s |")
    if trained.get("ok"):
        ranks = trained.get("distributed", {})
        reduce = (f"gradients all-reduced by {ranks['backend']}{' ' + ranks['nccl'] if ranks.get('nccl') else ''} "
                  f"over {ranks['world_size']} rank" if "backend" in ranks else "no collective")
        lines.append(f"| train | {trained['steps']} steps, {trained['positions']:,} positions online from "
                     f"{trained['train_sequences']:,} sequences, {trained['base_forwards']:,} base forwards; {reduce} "
                     f"| {trained['seconds']:.0f} | {trained['positions_per_second']:,.0f} positions/s |")
        lines += ["", f"Held-out top-1 at distances 1-{len(trained['heldout_top1_after'])} on "
                      f"{trained['heldout_sequences']} held-out sequences: "
                      f"{adopt.format_shares(trained['heldout_top1_before'])} before, "
                      f"{adopt.format_shares(trained['heldout_top1_after'])} after."]
    failed = [f"{stage} ({s['error']})" for stage, s in stages.items() if not s.get("ok")]
    return lines + (["", f"Failed: {'; '.join(failed)}."] if failed else [])


DRAFT_ARMS = {"blocks": "the draft's blocks", "grow": "a step's tree"}  # each comparison's arms, as a column heads them


def draft_arms_block(name: str, report: dict, docs_link: str) -> list[str]:
    """A draft-arms report (docs/tools/draft_blocks.py): the committed draft run two ways on the same prompts in turns
    (its matrices on each kind of GGUF block, or its trees grown natively or level by level): tok/s, against the first
    arm, tokens per step, ms a step and of it drafting."""
    arms = report["arms"]
    first = next(iter(arms.values()))
    lines = [provenance(report, "python docs/tools/draft_blocks.py"), "",
             f"`{report['method']}` of {report['model']}, {report['dtype']}, trees of {report['tree_size']} nodes, "
             f"{report['prompts']} {report['prompts_source']} first turns, {report['max_new_tokens']} new tokens; "
             f"the same tokens on {report['identical']} of {report['prompts']} "
             f"([report]({docs_link}measurements/{name}.json)).", "",
             f"| {DRAFT_ARMS[report['compare']]} | tok/s | x the first | tokens per step | ms a step "
             "| of it drafting |",
             "|---|---:|---:|---:|---:|---:|"]
    for arm, figures in arms.items():
        drafting = figures.get("drafting_ms_per_step")
        lines.append(f"| {arm}{' (the default)' if figures['default'] else ''} | {figures['tokens_per_s']:.1f} | "
                     f"{figures['tokens_per_s'] / first['tokens_per_s']:.3f} | {figures['tokens_per_step']:.3f} | "
                     f"{figures['ms_per_step']:.2f} | {'-' if drafting is None else f'{drafting:.2f}'} |")
    return lines + note_lines(report)


def ppd_tau_block(name: str, report: dict, docs_link: str) -> list[str]:
    """A tau-by-rows report (docs/tools/ppd_tau.py): the prompt tokens' tokens per step against the input rows a step
    feeds, decoded where the kernels verify that many rows losslessly, expected from the acceptance on the same
    answers everywhere, beside the thesis's Table 6.1."""
    thesis = "; ".join(f"{model} {t['tau']} with inputs of {t['rows']} rows" for model, t in report["thesis"].items())
    lines = [provenance(report, "python docs/tools/ppd_tau.py"), "",
             f"`ppd` of {report['model']} ({report['hyperparameters']['num_prompt_tokens']} prompt tokens x "
             f"{report['hyperparameters']['num_epts']} EPTs), {report['measure']['dtype']}, {report['prompts']} "
             f"{report['measure']['prompts']} first turns, {report['measure']['max_new_tokens']} new tokens; the same "
             f"tokens at every decoded size on {report['identical']} of {report['prompts']} "
             f"([report]({docs_link}measurements/{name}.json)). The thesis's tau (Table 6.1): {thesis}.", "",
             "| input rows | tau decoded | tau expected from these answers | tau the calibration expected "
             "| steps keeping at least 1/2/3 guesses |", "|---:|---:|---:|---:|---|"]
    for row in report["sizes"]:
        decoded = f"{row['tau']:.3f}" if "tau" in row else f"- (over {report['lossless_rows']} rows)"
        calibrated = f"{row['expected_tau']:.3f}" if "expected_tau" in row else "-"
        lines.append(f"| {row['rows']} | {decoded} | {row['mt_bench_expected_tau']:.3f} | {calibrated} | "
                     f"{adopt.format_shares(row.get('kept_share'))} |")
    top1 = "/".join(f"{v:.3f}".lstrip("0") for v in report["mt_bench_top1_by_distance"])
    top10 = "/".join(f"{v:.3f}".lstrip("0") for v in report["mt_bench_top10_by_distance"])
    return lines + ["", f"On these answers the guesses' top-1 was right {top1} and their top-10 {top10} at distances "
                        f"1-{len(report['mt_bench_top1_by_distance'])} (each given the nearer ones within the top-10)."]


def training_evals_block(name: str, report: dict, docs_link: str) -> list[str]:
    """A training-evals report (docs/tools/training_evals.py): per run, its held-out top-1 at every token distance
    (and top-10 at the second) at each evaluation step."""
    lines = [provenance(report, "python docs/tools/training_evals.py"), "",
             f"Held-out top-1 by token distance, {report['eval_sequences']} held-out sequences of the run's data "
             f"stage, at each evaluation step ([report]({docs_link}measurements/{name}.json)).", ""]
    for run in report["runs"]:
        depths = len(run["evals"][0]["top1"])
        lines += [f"{run['name']}: `{run['command']}`", "",
                  "| step | " + " | ".join(f"distance {d}" for d in range(1, depths + 1)) + " | top-10 at distance 2 |",
                  "|---:|" + "---:|" * (depths + 1)]
        for e in run["evals"]:
            top10 = f"{e['top10'][1]:.3f}" if depths > 1 else "-"
            lines.append(f"| {e['step']} | " + " | ".join(f"{v:.3f}" for v in e["top1"]) + f" | {top10} |")
        lines.append("")
    return lines[:-1] + note_lines(report)


def history_block(name: str, report: dict, docs_link: str) -> list[str]:
    """The transcribed history: a heading per day, in date order, then one line per finding with its machine and
    command."""
    lines = [f"Transcribed from {report['transcribed_from']} ([report]({docs_link}measurements/{name}.json)).", ""]
    day = None
    for entry in sorted(report["entries"], key=lambda e: e["date"]):  # sorted() is stable: a day keeps its order
        if entry["date"] != day:
            day = entry["date"]
            lines += [f"### {day}", ""] if len(lines) == 2 else ["", f"### {day}", ""]
        command = f"`{entry['command']}`" if entry.get("command") else "command not recorded"
        lines.append(f"- {entry['finding']} ({entry['machine']}; {command})")
    return lines


def report_kind(report: dict):
    """The renderer for a report, by what it holds."""
    if report.get("kind") == "serving-load":
        return serving_load_block
    if report.get("kind") == "cluster-throughput":
        return cluster_throughput_block
    if report.get("kind") == "gpu-lane":
        return gpu_lane_block
    if report.get("kind") == "draft-arms":
        return draft_arms_block
    if report.get("kind") == "ppd-tau":
        return ppd_tau_block
    if report.get("kind") == "training-evals":
        return training_evals_block
    if "entries" in report and "transcribed_from" in report:
        return history_block
    if "results" in report and "prompts_source" in report:
        return bench_block
    if "dtypes" in report and "read_bytes_per_s" in report:
        return step_cost_block
    if "perplexity" in report and "equal" in report:
        return precision_block
    raise ValueError("not a report this tool renders: a bench, step-cost, precision, serving-load, "
                     "cluster-throughput, GPU lane, draft-arms, tau-by-rows, training-evals or history report")


def docs_prefix(page: Path, docs: Path = DOCS) -> str:
    """What a link from `page` puts before a path under docs/: nothing in docs/, `docs/` from the README,
    `../../../../docs/` from a model card in ppdkit/models/components/NAME/."""
    if page.resolve().parent == docs.resolve():
        return ""
    up = Path(os.path.relpath(docs.resolve().parent, page.resolve().parent)).as_posix()  # to the repository's root
    return "docs/" if up == "." else f"{up}/docs/"


def render(name: str, page: Path, docs: Path = DOCS) -> str:
    """A block's body for `page`: the report docs/NAME.json rendered, its links relative to the page."""
    path = docs / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"{page.name}: no report docs/{name}.json for its figures block")
    report = json.loads(path.read_text())
    try:
        block = report_kind(report)
    except ValueError as e:
        raise ValueError(f"{page.name}: docs/{name}.json is {e}") from e
    docs_link = docs_prefix(page, docs)
    return "\n".join(block(Path(name).name, report, docs_link)) + "\n"


def rewrite(text: str, page: Path, docs: Path = DOCS) -> str:
    """`text` with every figures block rewritten from its report."""
    return BLOCK.sub(lambda m: m["open"] + render(m["name"], page, docs) + m["close"], text)


# --- the lint -------------------------------------------------------------------------------------------------------

def prose(text: str) -> str:
    """What a reader reads as the page's own words: figures blocks and fenced code blanked, lines kept in place."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731 - keeps line numbers true
    return FENCE.sub(blank, ADOPT_BLOCK.sub(blank, BLOCK.sub(blank, text)))


def measured_figures(text: str) -> list[str]:
    """`line N: KIND: 'FIGURE'` for each measured figure the page states outside its blocks and code."""
    found = []
    lines = prose(text).splitlines()
    for number, line in enumerate(lines, 1):
        for kind, pattern in MEASURED.items():
            found += [f"line {number}: {kind}: {m.group(0)!r}" for m in pattern.finditer(line)]
        is_header = line.startswith("|") and number < len(lines) and lines[number].startswith("|---")
        if is_header and MEASURED_COLUMN.search(line):
            found.append(f"line {number}: a table of measurements: {line[:60]!r}")
    return found


# --- the command line -----------------------------------------------------------------------------------------------

def pages(root: Path = ROOT) -> list[Path]:
    """The hand-written pages: the README, docs/*.md but those another tool writes whole, and the committed
    components' model cards."""
    return [root / "README.md", *(p for p in sorted((root / "docs").glob("*.md")) if p.name not in GENERATED_PAGES),
            *sorted((root / COMPONENTS).glob("*/README.md"))]


def stale_adopt_history(text: str, page: Path) -> list[str]:
    """Why a model card's `ppdkit adopt` table differs from the history.json beside it (none when it has no table)."""
    block = ADOPT_BLOCK.search(text)
    if block is None or block["body"] == adopt.history_table(adopt._history(page.parent)):
        return []
    return [f"its `ppdkit adopt` history table differs from {page.parent.name}/{adopt.HISTORY}: "
            f"rerun ppdkit/jobs/adopt.py's write_history_table"]


def problems(page: Path, docs: Path = DOCS) -> list[str]:
    """Why `page` fails the check: a stale block, or a measured figure outside a block."""
    text = page.read_text()
    stale = [f"its figures blocks differ from their reports: run {COMMAND}"] if rewrite(text, page, docs) != text else []
    return stale + stale_adopt_history(text, page) + measured_figures(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a block is stale or a page states a measured figure outside a block")
    args = parser.parse_args(argv)
    failed = False
    for page in pages():
        if args.check:
            for problem in problems(page):
                print(f"{page.relative_to(ROOT)}: {problem}", file=sys.stderr)
                failed = True
            continue
        text = page.read_text()
        if rewrite(text, page) != text:
            page.write_text(rewrite(text, page))
            print(f"wrote {page.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
