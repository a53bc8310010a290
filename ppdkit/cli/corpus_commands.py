"""`ppdkit corpus grow` (the base model writes more of its own conversations into a corpus), `ppdkit corpus show`
(what a corpus holds, its shards checked against their sha256) and `ppdkit adopt` (continual training's gate: a
draft trained on the grown corpus replaces the committed one only when it does better)."""

import argparse
import json
import logging
from pathlib import Path

log = logging.getLogger("ppdkit")


def _config(overrides: list[str]):
    from ppdkit.data_pipeline.corpus_grow import CorpusConfig

    from ppdkit.jobs.spec import SpecError, apply_overrides

    try:
        return CorpusConfig(**apply_overrides({}, overrides))
    except ValueError as e:
        raise SpecError(f"corpus settings: {e}") from None


def _root(args: argparse.Namespace, base_model: str) -> Path:
    from ppdkit.data_pipeline.corpus import committed_corpus

    return Path(args.corpus).expanduser() if args.corpus else committed_corpus(base_model)


def cmd_corpus_grow(args: argparse.Namespace) -> int:
    from ppdkit.data_pipeline.corpus import open_corpus
    from ppdkit.data_pipeline.corpus_grow import grow_corpus

    cfg = _config(args.overrides)
    root = _root(args, cfg.base_model)
    report = grow_corpus(root, cfg, max_shards=args.shards, hours=args.hours, threads=args.threads)
    figures = open_corpus(root).figures()
    print(json.dumps({"this_run": report.summary(), "corpus": {k: figures[k] for k in ("rows", "tokens", "shards")}}))
    return 0


def cmd_corpus_show(args: argparse.Namespace) -> int:
    from ppdkit.data_pipeline.corpus import open_corpus

    corpus = open_corpus(_root(args, "smollm2-135m"))
    corpus.verify()
    figures = corpus.figures()
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"corpus {corpus.root}: {corpus.manifest['base_model']}, {figures['shards']} shards, {figures['rows']} "
          f"conversations, {figures['tokens'] / 1e6:.2f}M tokens ({figures['answer_tokens'] / 1e6:.2f}M written "
          f"by the model), {figures['bytes'] / 1e6:.1f} MB ({figures['bytes_per_token']:.2f} bytes a token); "
          "every shard matches its sha256")
    for source, entry in figures["by_source"].items():
        print(f"  {source:<22} {entry['rows']:>7} conversations {entry['tokens'] / 1e6:>7.2f}M tokens "
              f"({entry['tokens'] / max(figures['tokens'], 1):.0%})")
    return 0


def cmd_corpus_merge(args: argparse.Namespace) -> int:
    import tempfile

    from ppdkit.data_pipeline.corpus import MANIFEST, merge_corpus, open_corpus, unpack_corpus
    from ppdkit.data_pipeline.corpus_grow import only_writer

    into = open_corpus(_root(args, "smollm2-135m"))
    other = Path(args.other).expanduser()
    with only_writer(into.root), tempfile.TemporaryDirectory() as scratch:
        if not (other / MANIFEST).is_file():  # what a GPU lane brings back: the corpus packed in parts
            other = unpack_corpus(other, Path(scratch))
        added = merge_corpus(into, open_corpus(other))
    print(f"merged {len(added)} shards ({sum(s['tokens'] for s in added)} tokens) into {into.root}")
    return 0


def add_corpus_commands(sub: argparse._SubParsersAction) -> None:
    corpus = sub.add_parser("corpus", help="the self-distilled corpus: grow it, show it")
    actions = corpus.add_subparsers(dest="action", required=True, metavar="ACTION")
    grow = actions.add_parser("grow", help="the base model writes more conversations into the corpus (resumes)")
    grow.add_argument("overrides", nargs="*", metavar="key=value",
                      help="settings (data_pipeline/corpus_grow.py CorpusConfig), e.g. rows_per_shard=64")
    grow.add_argument("--corpus", help="corpus folder (default: the committed corpus of the base model)")
    grow.add_argument("--shards", type=int, help="stop after this many shards (default: until stopped)")
    grow.add_argument("--hours", type=float, help="stop starting shards after this many hours")
    grow.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    grow.set_defaults(func=cmd_corpus_grow)
    show = actions.add_parser("show", help="a corpus's shards, tokens and mix, after checking every sha256")
    show.add_argument("--corpus", help="corpus folder (default: the committed SmolLM2 corpus)")
    show.add_argument("--json", action="store_true", help="the figures as JSON")
    show.set_defaults(func=cmd_corpus_show)
    merge = actions.add_parser("merge", help="copy another corpus's shards of the same base model into this one (a "
                                            "GPU lane's, brought back through $OUT)")
    merge.add_argument("other", help="the corpus folder whose shards come in, or a folder holding one packed in parts "
                                     "(corpus.tar.part-00, ...: what a GPU lane brings back)")
    merge.add_argument("--corpus", help="the corpus they go into (default: the committed SmolLM2 corpus)")
    merge.set_defaults(func=cmd_corpus_merge)
    add_adopt_command(sub)
    add_fit_tree_values_command(sub)


def cmd_adopt(args: argparse.Namespace) -> int:
    from ppdkit.data_pipeline.corpus import committed_corpus, is_corpus, open_corpus

    from ppdkit.jobs.adopt import MEASURE, adopt

    corpus = Path(args.corpus) if args.corpus else committed_corpus("smollm2-135m")
    tokens = open_corpus(corpus).figures()["tokens"] if is_corpus(corpus) else None
    row = adopt(Path(args.candidate), Path(args.component), Path(args.run) if args.run else None, tokens,
                args.limit or MEASURE["limit"], dry_run=args.dry_run, corpus=corpus if is_corpus(corpus) else None)
    print(json.dumps(row, indent=2))
    return 0


def cmd_fit_tree_values(args: argparse.Namespace) -> int:
    from ppdkit.data_pipeline.corpus import committed_corpus

    from ppdkit.trainer.tree_values_fit import fit_tree_values

    corpus = Path(args.corpus) if args.corpus else committed_corpus("smollm2-135m")
    values = fit_tree_values(Path(args.component), corpus, args.prompts, args.method, args.dtype,
                             args.max_new_tokens, args.seed, write=not args.dry_run)
    print(json.dumps(values.to_json(), indent=2))
    return 0


def add_fit_tree_values_command(sub: argparse._SubParsersAction) -> None:
    fit = sub.add_parser("fit-tree-values", help="fit what a grown tree's guesses are worth (draft, corpus and chain "
                                                 "together) on held-out corpus prompts; adds tree_values.json to the "
                                                 "component")
    fit.add_argument("component", help="an eagle3 or feature-head component directory")
    fit.add_argument("--corpus", help="its base model's corpus (default: the committed SmolLM2 corpus)")
    fit.add_argument("--prompts", type=int, default=64, help="held-out first turns to decode (default 64)")
    fit.add_argument("--method", default="eagle3-corpus", help="the grown-tree method to decode with")
    fit.add_argument("--dtype", default="float32", help="the decoder's dtype (default float32)")
    fit.add_argument("--max-new-tokens", type=int, default=128)
    fit.add_argument("--seed", type=int, default=0, help="which held-out conversations are drawn")
    fit.add_argument("--dry-run", action="store_true", help="fit and print, write nothing")
    fit.set_defaults(func=cmd_fit_tree_values)


def add_adopt_command(sub: argparse._SubParsersAction) -> None:
    adopt = sub.add_parser("adopt", help="continual training's gate: replace a committed draft by a new one only if "
                                         "it keeps more tokens per step on MT-Bench (history in its folder)")
    adopt.add_argument("candidate", help="the newly trained component (a run's train/component)")
    adopt.add_argument("--component", required=True, help="the committed component it would replace")
    adopt.add_argument("--run", help="the candidate's run directory (its train/result.json: held-out top-1, "
                                     "positions trained), or what a GPU lane brought back (its lane.json)")
    adopt.add_argument("--corpus", help="the corpus it trained on, for the history, where the run's data stage does "
                                        "not say (default: the committed one)")
    adopt.add_argument("--limit", type=int, help="first N MT-Bench turns only (a quick look: the measure is all 80)")
    adopt.add_argument("--dry-run", action="store_true", help="measure and record, never replace")
    adopt.set_defaults(func=cmd_adopt)
