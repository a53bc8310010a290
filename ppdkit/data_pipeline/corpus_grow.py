"""`ppdkit corpus grow`: the base model writes its own conversations into a corpus, shard by shard, resumably.

Each shard takes the next `rows_per_shard` rows of one source (sources are read in their own fixed order, so
a shard is named by its source and first row) and the base model rewrites every assistant turn, and writes every
user turn marked `write` (Magpie), on the decoder's own runtime with continuous batching
(data_pipeline/regenerate.py): greedy answers are token for token `ppdkit decode --method ar`'s. The next shard's
source is the one furthest below its share of the mix (by tokens), so the corpus keeps its mix at any size. A
conversation whose prompts copy a benchmark prompt (data_pipeline/contamination.py) never enters it.

A run stops after `--shards` shards or `--hours`, or when stopped: the shard being written is lost, every earlier
one is kept, and the next run goes on from the manifest. SIGSTOP and SIGCONT pause and resume it (what a session
does while it times something else).
"""

import fcntl
import logging
import platform
import time
from contextlib import contextmanager
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, model_validator
from tqdm import tqdm

from ppdkit.models.config import BaseModelConfig, Section
from ppdkit.models.device_plan import current_device_plan
from ppdkit.models.loading import load_base_model
from ppdkit.runtime.forward.linear import SKINNY_MAX_ROWS
from ppdkit.runtime.kernels.native import cpu_info
from ppdkit.runtime.forward.precision import resolve_dtype

from .config import PROMPT_TEMPERATURE
from .contamination import BenchmarkIndex, benchmark_index, prompt_text
from .conversations import Conversation, MalformedRow, ReadReport, to_conversation
from .corpus import Corpus, CorpusError, CorpusRow, answer_spans, append_shard, create_corpus, drop_unlisted
from .prompt_kinds import KINDS
from .readers import SOURCES, iter_rows
from .regenerate import regenerate_conversations, regeneration_runtime
from .templating import encode_conversation

log = logging.getLogger(__name__)

# every kind of Magpie prompt, then people's chats and ShareGPT's conversations: the default mix, by tokens
DEFAULT_MIX = {**{f"magpie-{kind}": 1.0 for kind in KINDS}, "chitchat": 2.0, "sharegpt": 6.0}


class CorpusConfig(Section):
    """How a corpus is grown; recorded with every shard it writes."""

    base_model: str = Field("smollm2-135m", min_length=1, description="the model that writes (catalog name or HF dir)")
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="the runtime's dtype (auto: bfloat16 where the native kernels run), recorded per shard")
    max_length: int = Field(512, ge=8, description="tokens a conversation may reach (later turns are not written)")
    max_new_tokens: int = Field(256, ge=1, description="tokens per written turn at most")
    temperature: float = Field(0.0, ge=0.0, description="of the answers: 0 is greedy, what the draft is measured on")
    prompt_temperature: float = Field(PROMPT_TEMPERATURE, gt=0.0, description="of the user turns the model writes")
    seed: int = Field(0, description="each turn draws with regenerate.turn_seed(seed, conversation, turn)")
    generate_batch: int = Field(64, ge=1, le=4096, description="conversations decoded together: the runtime's slots "
                                "(continuous batching, at most 96 rows), or transformers' batch on a GPU")
    rows_per_shard: int = Field(128, ge=1, description="source rows a shard takes (the unit of resume)")
    mix: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_MIX),
                                  description="source -> share of the corpus's tokens")

    @model_validator(mode="after")
    def _known_sources(self) -> "CorpusConfig":
        unknown = sorted(set(self.mix) - set(SOURCES))
        if unknown:
            raise ValueError(f"corpus mix: unknown sources {unknown}; use packaged ones: {', '.join(SOURCES)}")
        if not any(w > 0 for w in self.mix.values()):
            raise ValueError("corpus mix: give at least one source a share above 0")
        return self


@dataclass
class _Stream:
    """One source's rows in their fixed order, read on from where the last shard of it stopped."""

    source: str
    position: int = 0
    rows: Iterator | None = None
    ended: bool = False

    def take(self, first: int, count: int) -> list[tuple[str, object]]:
        """Rows first .. first + count - 1, as the reader gives them: (where, row or MalformedRow)."""
        if self.rows is None or self.position != first:
            self.rows, self.position = iter_rows(self.source), 0
            for _ in range(first):
                if next(self.rows, None) is None:
                    break
                self.position += 1
        taken = []
        for _ in range(count):
            item = next(self.rows, None)
            if item is None:
                self.ended = True
                break
            taken.append(item)
            self.position += 1
        return taken


@dataclass
class GrowReport:
    shards: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    generated_tokens: int = 0

    def summary(self) -> dict:
        return {"shards_written": len(self.shards), "rows": sum(s["rows"] for s in self.shards),
                "tokens": sum(s["tokens"] for s in self.shards), "generated_tokens": self.generated_tokens,
                "seconds": round(self.seconds, 1),
                "generated_tokens_per_s": round(self.generated_tokens / max(self.seconds, 1e-9), 1)}


def next_source(corpus: Corpus, mix: dict[str, float], ended: set[str]) -> str | None:
    """The source furthest below its share of the corpus's tokens (the mix's order breaks ties)."""
    tokens = {source: 0 for source in mix}
    for shard in corpus.shards:
        if shard["source"] in tokens:
            tokens[shard["source"]] += shard["tokens"]
    open_sources = [s for s, w in mix.items() if w > 0 and s not in ended]
    return min(open_sources, key=lambda s: tokens[s] / mix[s]) if open_sources else None


def next_row(corpus: Corpus, source: str, seed: int) -> int:
    """The first row of `source` no shard of this seed has taken (another seed writes other prompts and answers)."""
    return max((s["first"] + s["count"] for s in corpus.shards
                if s["source"] == source and s["settings"]["seed"] == seed), default=0)


def shard_name(source: str, seed: int, first: int) -> str:
    return f"{source}-s{seed}-{first:08d}.parquet"


def _conversations(taken: list, report: ReadReport, index: BenchmarkIndex) -> list[Conversation]:
    convs = []
    for where, row in taken:
        try:
            if isinstance(row, MalformedRow):
                raise row
            conv = to_conversation(row, fallback_id=where)
        except MalformedRow as e:
            report.skip(where, str(e))
            continue
        if (item := index.match(prompt_text(conv.messages))) is not None:
            report.skip(where, f"copies benchmark prompt {item.split(':')[0]}")
            continue
        if conv.messages[-1]["role"] == "user":  # a last question left unanswered (chitchat's one-liners): answered
            conv = Conversation(conv.id, (*conv.messages, {"role": "assistant", "content": ""}))
        convs.append(conv)
    return convs


def write_conversations(loaded, runtime, convs: list[Conversation], cfg: CorpusConfig, source: str,
                        index: BenchmarkIndex, report: ReadReport, on_tokens) -> list[CorpusRow]:
    """The model's own versions of `convs` as corpus rows; what cannot be kept is counted in `report`."""
    slots = cfg.generate_batch if runtime is None else min(cfg.generate_batch, SKINNY_MAX_ROWS)
    new = regenerate_conversations(loaded.model, loaded.tokenizer, convs, max_new_tokens=cfg.max_new_tokens,
                                   max_length=cfg.max_length, temperature=cfg.temperature, seed=cfg.seed,
                                   batch_size=slots, runtime=runtime,
                                   prompt_temperature=cfg.prompt_temperature, on_tokens=on_tokens)
    rows = []
    for old, conv in zip(convs, new):
        if not conv.messages:
            report.skip(conv.id, "the model wrote an empty prompt")
            continue
        if (item := index.match(prompt_text(conv.messages))) is not None:
            report.skip(conv.id, f"wrote a copy of benchmark prompt {item.split(':')[0]}")
            continue
        try:
            enc = encode_conversation(loaded.tokenizer, conv, cfg.max_length)
        except MalformedRow as e:
            report.skip(conv.id, str(e))
            continue
        report.keep()
        rows.append(CorpusRow(id=row_id(conv.id, cfg.seed), source=source, input_ids=enc.input_ids,
                              answer_spans=answer_spans(enc.loss_mask), seed=cfg.seed, temperature=cfg.temperature,
                              prompt_temperature=cfg.prompt_temperature if old.has_turns_to_write() else None))
    return rows


def row_id(conversation: str, seed: int) -> str:
    """A corpus row's id: its source row's, and another seed's mark, since another seed writes another conversation
    from the same source row (other Magpie prompts, other sampled answers). Seed 0's ids carry none: they predate
    seeds, and the held-out split hashes them."""
    return conversation if seed == 0 else f"{conversation}-s{seed}"


def who_writes(device: str) -> dict:
    """Who writes: the dtype and the CPU or GPU (greedy answers are the model's in that dtype, on those kernels)."""
    info = cpu_info()
    flags = set(info.get("flags", "").split())
    units = [f for f in ("amx_bf16", "avx512_bf16", "avx512_vnni", "avx512f", "avx2") if f in flags]
    gpu = {"gpu": torch.cuda.get_device_name(device)} if torch.device(device).type == "cuda" else {}
    return {"cpu": info.get("model name") or platform.processor(), "cpu_units": units, **gpu}


def grow_corpus(root: Path, cfg: CorpusConfig, max_shards: int | None = None, hours: float | None = None,
                threads: int | None = None, device: str = "cpu") -> GrowReport:
    """Append shards to the corpus at `root` (made if absent) until `max_shards`, `hours` or the sources end. On a GPU
    (`device` cuda) the model writes through transformers' generate in batches of generate_batch."""
    if threads:
        torch.set_num_threads(threads)
    started = time.time()
    dtype = resolve_dtype(cfg.compute_dtype, device)
    loaded = load_base_model(cfg.base_model, "none", dtype)
    loaded.model.to(device)
    # the plan of `device`, not of the machine: a GPU machine told `cpu` writes on the CPU's runtime
    runtime = regeneration_runtime(loaded, BaseModelConfig(name=cfg.base_model, quantization="none"), dtype,
                                   cfg.max_length, current_device_plan(device))
    corpus = create_corpus(root, cfg.base_model, loaded.fingerprint, loaded.tokenizer, cfg.max_length)
    with only_writer(root):
        if dropped := drop_unlisted(corpus):
            log.info("corpus: dropped %d files no manifest entry lists (a stopped writer's): %s", len(dropped),
                     ", ".join(dropped))
        writer = {**who_writes(device), "compute_dtype": dtype,
                  "engine": "runtime" if runtime is not None else "transformers"}
        log.info("corpus %s: %d shards, %d tokens; growing with %s on %s (%s)", root, len(corpus.shards),
                 sum(s["tokens"] for s in corpus.shards), cfg.base_model, writer.get("gpu", writer["cpu"]), dtype)
        report = GrowReport()
        try:
            _grow(corpus, cfg, loaded, runtime, writer, report, max_shards,
                  None if hours is None else started + hours * 3600)
        finally:
            report.seconds = time.time() - started
    return report


def _grow(corpus: Corpus, cfg: CorpusConfig, loaded, runtime, writer: dict, report: GrowReport,
          max_shards: int | None, deadline: float | None) -> None:
    """Shard after shard into `report`, until `max_shards`, the deadline or the end of every source."""
    index = benchmark_index()
    streams = {source: _Stream(source) for source in cfg.mix}
    ended: set[str] = set()
    with tqdm(total=max_shards, desc="corpus shards", unit="shard") as bar:
        while max_shards is None or len(report.shards) < max_shards:
            if deadline is not None and time.time() > deadline:
                break
            source = next_source(corpus, cfg.mix, ended)
            if source is None:
                log.info("corpus: every source in the mix has ended")
                break
            first = next_row(corpus, source, cfg.seed)
            taken = streams[source].take(first, cfg.rows_per_shard)
            if not taken:
                ended.add(source)
                continue
            shard_started, generated = time.time(), [0]
            shard_report = ReadReport(source=source)
            convs = _conversations(taken, shard_report, index)
            rows = write_conversations(loaded, runtime, convs, cfg, source, index, shard_report,
                                       lambda n: generated.__setitem__(0, generated[0] + n))
            seconds = time.time() - shard_started
            record = {"source": source, "first": first, "count": len(taken), **writer,
                      "settings": cfg.model_dump(exclude={"mix", "rows_per_shard", "base_model"}),
                      "skipped": dict(shard_report.skipped), "generated_tokens": generated[0],
                      "seconds": round(seconds, 1)}
            # a shard of no rows too: it records that its source's rows were looked at
            report.shards.append(append_shard(corpus, shard_name(source, cfg.seed, first), rows, record))
            report.generated_tokens += generated[0]
            bar.update()
            bar.set_postfix(source=source, tok_s=f"{generated[0] / max(seconds, 1e-9):.0f}",
                            corpus_M=f"{sum(s['tokens'] for s in corpus.shards) / 1e6:.2f}")
            if streams[source].ended:
                ended.add(source)
            elif not rows:  # an endless source would write empty shards for ever
                log.warning("corpus: %d rows of %s gave no conversation (%s); left out of this run",
                            len(taken), source, shard_report.describe())
                ended.add(source)


@contextmanager
def only_writer(root: Path):
    """An exclusive lock on the corpus while it is written: two writers would each record shards the other's
    manifest lacks."""
    with open(root / ".grow.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CorpusError(f"corpus {root} is being written by another process (it holds {root / '.grow.lock'}):"
                              " wait for it, or stop it (its finished shards are kept)") from None
        yield

