"""The self-distilled corpus: the base model's own conversations in versioned shards that outlive machines.

A corpus is a folder: `corpus.json` (the manifest) and `shards/*.parquet`. Each row is one conversation as
training reads it: its token ids (the chat template's rendering, user turns and the base model's answers) and
the [start, end) spans of the answers' tokens, with how it was made (source, seed, temperatures). Ids are
stored as uint16 where the vocabulary fits (SmolLM2's 49152 does) in zstd-compressed Parquet: about 1.5 bytes a
token, so millions of tokens can be committed beside the code. `datasets` reads the shards as they are
(`load_dataset("parquet", data_files=...)`); `load_corpus` does that after checking every shard's sha256.

Durability: a shard is written under a temporary name, flushed, renamed, and only then recorded in the
manifest (itself replaced atomically), so a shard is whole or absent; a file the manifest does not list (its
writer was stopped between the two steps) is dropped when the corpus is opened for growing. Teacher targets and
hidden states are not kept: they are recomputed from the ids (the data stage reads a corpus as a source).
"""

import datetime
import hashlib
import json
import os
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ppdkit.models.paths import file_sha256, write_json_atomic

FORMAT = "ppdkit-corpus/1"
MANIFEST = "corpus.json"
SHARDS = "shards"
PACKED = "corpus.tar.part-"  # a corpus packed to travel: one tar in numbered parts (a device call brings back 8 files)
_ZSTD_LEVEL = 19  # shards are written once and read many times: the slowest level's extra time is paid once


class CorpusError(ValueError):
    """A corpus that cannot be used as it is: the message says what is wrong and how to fix it."""


@dataclass(frozen=True)
class CorpusRow:
    id: str
    source: str
    input_ids: list[int]
    answer_spans: list[tuple[int, int]]  # [start, end) token ranges the base model wrote (the loss mask's ones)
    seed: int  # the regeneration's seed: each turn drew with regenerate.turn_seed(seed, id, turn)
    temperature: float  # of the answers (0: greedy)
    prompt_temperature: float | None  # of the user turns the model wrote, None where all were given

    def loss_mask(self) -> list[int]:
        mask = [0] * len(self.input_ids)
        for start, end in self.answer_spans:
            mask[start:end] = [1] * (end - start)
        return mask


def answer_spans(loss_mask: list[int]) -> list[tuple[int, int]]:
    """The runs of ones in a loss mask, as [start, end) pairs."""
    spans, start = [], None
    for t, m in enumerate([*loss_mask, 0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            spans.append((start, t))
            start = None
    return spans


def _schema(id_type: pa.DataType) -> pa.Schema:
    return pa.schema([("id", pa.string()), ("source", pa.string()), ("input_ids", pa.list_(id_type)),
                      ("answer_starts", pa.list_(pa.uint32())), ("answer_ends", pa.list_(pa.uint32())),
                      ("seed", pa.int64()), ("temperature", pa.float32()), ("prompt_temperature", pa.float32())])


def _stored(row: CorpusRow) -> dict:
    fields = asdict(row)
    spans = fields.pop("answer_spans")
    return {**fields, "answer_starts": [a for a, _ in spans], "answer_ends": [b for _, b in spans]}


def id_type_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def tokenizer_identity(tokenizer) -> dict:
    """What makes two tokenizers interchangeable for stored ids: class, size and a digest of the vocabulary."""
    vocab = sorted(tokenizer.get_vocab().items())
    return {"class": type(tokenizer).__name__, "size": len(vocab),
            "vocab_sha256": hashlib.sha256(json.dumps(vocab).encode()).hexdigest()}


@dataclass
class Corpus:
    """An open corpus folder and its manifest."""

    root: Path
    manifest: dict

    @property
    def shards(self) -> list[dict]:
        return self.manifest["shards"]

    def figures(self) -> dict:
        """Rows, tokens and answer tokens, overall and by source, and bytes on disk."""
        by_source: dict[str, dict[str, int]] = {}
        for shard in self.shards:
            entry = by_source.setdefault(shard["source"], {"rows": 0, "tokens": 0, "answer_tokens": 0, "shards": 0})
            for key in ("rows", "tokens", "answer_tokens"):
                entry[key] += shard[key]
            entry["shards"] += 1
        total = {key: sum(s[key] for s in self.shards) for key in ("rows", "tokens", "answer_tokens", "bytes")}
        return {**total, "shards": len(self.shards), "bytes_per_token": total["bytes"] / max(total["tokens"], 1),
                "by_source": dict(sorted(by_source.items()))}

    def files(self) -> list[Path]:
        return [self.root / shard["file"] for shard in self.shards]

    def verify(self) -> None:
        """Every listed shard is there with its recorded sha256, or a CorpusError says which and what to do."""
        for shard in self.shards:
            path = self.root / shard["file"]
            if not path.is_file():
                raise CorpusError(f"corpus {self.root}: shard {shard['file']} is listed in {MANIFEST} but missing: "
                                  "restore it (git checkout) or remove its entry and grow the corpus again")
            if file_sha256(path) != shard["sha256"]:
                raise CorpusError(f"corpus {self.root}: shard {shard['file']} does not match the sha256 in "
                                  f"{MANIFEST} (damaged or edited): restore it (git checkout) or delete it and its "
                                  "entry and grow the corpus again")

    def check_base_model(self, fingerprint: str, tokenizer: dict) -> None:
        if tokenizer != self.manifest["tokenizer"]:
            raise CorpusError(f"corpus {self.root} was written with another tokenizer than the base model's "
                              f"({self.manifest['base_model']}'s: {self.manifest['tokenizer']['class']} of "
                              f"{self.manifest['tokenizer']['size']} tokens): its ids mean other words; use a corpus "
                              "of this base model or grow a new one (ppdkit corpus grow --base-model ...)")
        if fingerprint != self.manifest["fingerprint"]:
            raise CorpusError(f"corpus {self.root} was written by another base model ({self.manifest['base_model']}, "
                              f"fingerprint {self.manifest['fingerprint'][:12]}, not {fingerprint[:12]}): its answers "
                              "are not this model's own; grow a corpus with this one (ppdkit corpus grow)")


def committed_corpus(base_model: str) -> Path:
    """The corpus that comes with ppdkit for a catalog base model (data_pipeline/corpora/<name>)."""
    return Path(__file__).parent / "corpora" / base_model


def is_corpus(path: str | Path) -> bool:
    return (Path(path).expanduser() / MANIFEST).is_file()


def has_committed_corpus(base_model: str) -> bool:
    """Whether ppdkit comes with a corpus for `base_model`: a catalog name (not a local directory) with one in
    data_pipeline/corpora (what a decoder of that base model drafts from in the corpus methods)."""
    return Path(base_model).name == base_model and is_corpus(committed_corpus(base_model))


def corpus_source(source: str, base_name: str) -> Path | None:
    """The corpus folder a data.source names: `corpus` (the one committed for the base model) or a folder holding
    corpus.json; None for any other source."""
    if source == "corpus":
        return committed_corpus(base_name)
    return Path(source).expanduser() if is_corpus(source) else None


def corpus_digest(source: str, base_name: str) -> str | None:
    """A digest of the shards a corpus source holds now (None for other sources): it changes as the corpus grows."""
    root = corpus_source(source, base_name)
    if root is None or not is_corpus(root):
        return None
    return hashlib.sha256("".join(s["sha256"] for s in open_corpus(root).shards).encode()).hexdigest()[:16]


def open_corpus(root: str | Path) -> Corpus:
    root = Path(root).expanduser()
    path = root / MANIFEST
    if not path.is_file():
        raise CorpusError(f"{root} is not a corpus: it has no {MANIFEST} (make one with ppdkit corpus grow)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise CorpusError(f"corpus {root} is in format {manifest.get('format')!r}; this ppdkit reads {FORMAT}")
    return Corpus(root, manifest)


def create_corpus(root: Path, base_model: str, fingerprint: str, tokenizer, max_length: int) -> Corpus:
    """An empty corpus for `base_model`, or the one already at `root` after checking it is that model's."""
    identity = tokenizer_identity(tokenizer)
    if (root / MANIFEST).is_file():
        corpus = open_corpus(root)
        corpus.check_base_model(fingerprint, identity)
        return corpus
    root.mkdir(parents=True, exist_ok=True)
    manifest = {"format": FORMAT, "base_model": base_model, "fingerprint": fingerprint, "tokenizer": identity,
                "id_type": id_type_for(len(tokenizer)), "max_length": max_length, "shards": []}
    write_json_atomic(root / MANIFEST, manifest)
    return Corpus(root, manifest)


def drop_unlisted(corpus: Corpus) -> list[str]:
    """Remove shard files the manifest does not list (a writer stopped between rename and record) and temporary
    files; returns their names. Only a corpus being grown does this: readers ignore such files."""
    listed = {Path(s["file"]).name for s in corpus.shards}
    dropped = []
    for path in sorted((corpus.root / SHARDS).glob("*")) if (corpus.root / SHARDS).is_dir() else []:
        if path.name not in listed:
            path.unlink()
            dropped.append(path.name)
    return dropped


def append_shard(corpus: Corpus, name: str, rows: list[CorpusRow], record: dict) -> dict:
    """Write `rows` as shard `name` and record it (with `record`'s settings) in the manifest: whole or absent."""
    if any(s["file"] == f"{SHARDS}/{name}" for s in corpus.shards):
        raise CorpusError(f"corpus {corpus.root} already holds shard {name}")
    id_type = getattr(pa, corpus.manifest["id_type"])()
    table = pa.Table.from_pylist([_stored(r) for r in rows], schema=_schema(id_type))
    folder = corpus.root / SHARDS
    folder.mkdir(exist_ok=True)
    final, tmp = folder / name, folder / f".{name}.tmp"
    pq.write_table(table, tmp, compression="zstd", compression_level=_ZSTD_LEVEL)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    entry = {**record, "file": f"{SHARDS}/{name}", "sha256": file_sha256(final), "bytes": final.stat().st_size,
             "rows": len(rows), "tokens": sum(len(r.input_ids) for r in rows),
             "answer_tokens": sum(b - a for r in rows for a, b in r.answer_spans),
             "written": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    corpus.shards.append(entry)
    write_json_atomic(corpus.root / MANIFEST, corpus.manifest)
    return entry


def _shard_ids(corpus: Corpus, shard: dict) -> list[str]:
    """A shard's row ids, its id column alone (not the token ids)."""
    return pq.read_table(corpus.root / shard["file"], columns=["id"]).column("id").to_pylist()


def merge_corpus(into: Corpus, other: Corpus) -> list[dict]:
    """Copy `other`'s shards that `into` lacks (by file name) into it, each checked against its sha256 and both
    corpora against one base model; returns the entries added. A GPU lane's corpus comes home this way."""
    other.verify()
    into.check_base_model(other.manifest["fingerprint"], other.manifest["tokenizer"])
    if other.manifest["id_type"] != into.manifest["id_type"]:
        raise CorpusError(f"corpus {other.root} stores ids as {other.manifest['id_type']}, {into.root} as "
                          f"{into.manifest['id_type']}")
    have = {Path(s["file"]).name for s in into.shards}
    ids = {i for shard in into.shards for i in _shard_ids(into, shard)}
    for shard in other.shards:
        if Path(shard["file"]).name not in have:
            repeated = [i for i in _shard_ids(other, shard) if i in ids]
            if repeated:
                raise CorpusError(f"shard {shard['file']} of {other.root} repeats {len(repeated)} conversation ids of "
                                  f"{into.root} (first: {repeated[0]}): each id names one conversation. A corpus "
                                  "grown with another seed marks its ids with it (corpus_grow.row_id); grow this "
                                  "one again with a ppdkit that does")
    added = []
    (into.root / SHARDS).mkdir(exist_ok=True)
    for shard in other.shards:
        name = Path(shard["file"]).name
        if name in have:
            continue
        tmp = into.root / SHARDS / f".{name}.tmp"
        shutil.copyfile(other.root / shard["file"], tmp)
        os.replace(tmp, into.root / SHARDS / name)
        entry = {**shard, "file": f"{SHARDS}/{name}"}
        into.shards.append(entry)
        write_json_atomic(into.root / MANIFEST, into.manifest)
        added.append(entry)
    return added


def pack_corpus(root: Path, out: Path, part_bytes: int) -> list[Path]:
    """The corpus folder `root` as one uncompressed tar (its shards are zstd already) cut into parts of at most
    `part_bytes`, out/corpus.tar.part-00, -01, ...; `root` is removed. `unpack_corpus` puts it together again."""
    tar = out / "corpus.tar"
    with tarfile.open(tar, "w") as packed:
        packed.add(root, arcname="corpus")
    parts = []
    with open(tar, "rb") as whole:
        while chunk := whole.read(part_bytes):
            parts.append(out / f"{PACKED}{len(parts):02d}")
            parts[-1].write_bytes(chunk)
    tar.unlink()
    shutil.rmtree(root)
    return parts


def unpack_corpus(folder: Path, into: Path) -> Path:
    """The corpus packed in folder/corpus.tar.part-* (pack_corpus), extracted under `into`; its root. Only plain
    files and folders inside the tar's own corpus/ are taken: a part that is missing or altered fails the corpus's
    sha256 check when it is opened."""
    parts = sorted(folder.glob(f"{PACKED}*"))
    if not parts:
        raise CorpusError(f"{folder} holds no corpus and no packed one ({PACKED}00, ...)")
    tar = into / "corpus.tar"
    with open(tar, "wb") as whole:
        for part in parts:
            whole.write(part.read_bytes())
    with tarfile.open(tar) as packed:
        members = packed.getmembers()
        unsafe = [m.name for m in members if not (m.isfile() or m.isdir()) or Path(m.name).is_absolute()
                  or ".." in Path(m.name).parts or Path(m.name).parts[0] != "corpus"]
        if unsafe:
            raise CorpusError(f"the packed corpus in {folder} holds what a corpus does not: {unsafe[:3]}")
        packed.extractall(into, members=members)
    tar.unlink()
    return into / "corpus"


def stream_rows(corpus: Corpus) -> Iterator[CorpusRow]:
    """Every row of the (verified) corpus, in manifest order, one shard's rows in memory at a time: a reader that
    goes through the corpus once, or stops at data.limit, need not hold every token id as a Python int (the whole
    corpus is tens of millions of them), nor parse the shards past its limit (every shard's sha256 is checked
    first all the same)."""
    corpus.verify()
    for shard in corpus.shards:
        for r in pq.read_table(corpus.root / shard["file"]).to_pylist():
            yield CorpusRow(id=r["id"], source=r["source"], input_ids=r["input_ids"],
                            answer_spans=list(zip(r["answer_starts"], r["answer_ends"])), seed=r["seed"],
                            temperature=r["temperature"], prompt_temperature=r["prompt_temperature"])


def read_rows(corpus: Corpus) -> list[CorpusRow]:
    """Every row of the (verified) corpus, in manifest order."""
    return list(stream_rows(corpus))


def load_corpus(root: str | Path):
    """The corpus as one `datasets.Dataset` (columns as stored), after checking every shard's sha256."""
    from datasets import load_dataset

    corpus = open_corpus(root)
    corpus.verify()
    if not corpus.shards:
        raise CorpusError(f"corpus {corpus.root} holds no shard yet: grow it first (ppdkit corpus grow)")
    return load_dataset("parquet", data_files=[str(p) for p in corpus.files()], split="train")
