"""What the tools that measure the committed EAGLE-3 draft on the adoption gate's measure share (corpus_chain.py,
fitted_values.py): their command line, the check that every decoding gave the same tokens, and where the report
goes."""

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "ppdkit" / "models" / "components" / "smollm2-135m-eagle3"


def gate_main(argv: list[str] | None, doc: str, out: Path, measure: Callable[[Path, int | None], dict],
              table: Callable[[dict], str], model_help: str, differ: str) -> int:
    """Measure (`measure(component, limit)` -> a report with `prompts` and `identical`, the prompts every decoding
    agreed on), refuse a report where any decoding differed (`differ` says which), else write it and print its
    table."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", default=str(COMPONENT), help=model_help)
    parser.add_argument("--limit", type=int, default=None, help="fewer prompts than the measure's (a quick look)")
    parser.add_argument("--out", default=str(out))
    args = parser.parse_args(argv)
    report = measure(Path(args.model), args.limit)
    if report["identical"] != report["prompts"]:
        print(f"{differ} on {report['prompts'] - report['identical']} prompts: decoding is not lossless; report this",
              file=sys.stderr)
        return 1
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    return 0
