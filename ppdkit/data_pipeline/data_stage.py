"""The `data` stage: read conversations, split off a held-out set, template and tokenize on Ray tasks.

Writes `train/` and `holdout/` (HF datasets: id, input_ids, loss_mask) into the stage directory and
returns the stage's figures. The base model itself scores a few held-out sequences (teacher-forced
loss and top-1 accuracy on assistant tokens), which proves the data and the model fit together
before hours of teacher pass and training are spent on them.
"""

import json
import logging
import math
import shutil
from pathlib import Path

import ray
import torch
from datasets import Dataset
from tqdm import tqdm
from transformers import AutoConfig

from ppdkit.models.catalog import materialize
from ppdkit.models.fingerprint import cached_fingerprint
from ppdkit.models.config import BaseModelConfig
from ppdkit.models.loading import load_base_model, load_tokenizer

from .config import DataConfig
from .conversations import Conversation, MalformedRow, ReadReport
from .corpus import corpus_source, open_corpus, stream_rows, tokenizer_identity
from .dataset_info import split_record
from .holdout import split_holdout, split_holdout_by_id
from .ray_placement import largest_node_cpus
from .readers import read_conversations
from .templating import TokenizedConversation, encode_conversation

log = logging.getLogger(__name__)


def tokenize_shard(tokenizer, conversations: list[Conversation], max_length: int) -> tuple[list[TokenizedConversation], ReadReport]:
    report = ReadReport(source="templating")
    rows = []
    for conv in conversations:
        try:
            rows.append(encode_conversation(tokenizer, conv, max_length))
            report.keep()
        except MalformedRow as e:
            report.skip(f"conversation {conv.id}", str(e))
    return rows, report


@ray.remote
def _tokenize_shard_task(tokenizer, conversations, max_length):
    return tokenize_shard(tokenizer, conversations, max_length)


@ray.remote
def _score_task(base: BaseModelConfig, rows: list[TokenizedConversation]) -> dict:
    return score_with_base_model(base, rows)


def score_with_base_model(base: BaseModelConfig, rows: list[TokenizedConversation]) -> dict:
    """Teacher-forced mean NLL and top-1 accuracy of the base model on the assistant tokens of `rows`."""
    loaded = load_base_model(base.name, base.quantization, base.dtype)
    nll_sum, correct, count = 0.0, 0, 0
    with torch.inference_mode():
        for row in rows:
            ids = torch.tensor([row.input_ids])
            logits = loaded.model(ids.to(loaded.model.device)).logits[0, :-1].float().cpu()  # [T-1, V]: for t+1
            target = ids[0, 1:]
            mask = torch.tensor(row.loss_mask[1:], dtype=torch.bool)
            logp = torch.log_softmax(logits[mask], dim=-1)
            nll_sum += -logp.gather(1, target[mask, None]).sum().item()
            correct += (logp.argmax(-1) == target[mask]).sum().item()
            count += int(mask.sum())
    return {"base_model_fingerprint": loaded.fingerprint, "check_tokens": count,
            "check_nll": nll_sum / max(count, 1), "check_top1": correct / max(count, 1)}


def _tokenize_on_ray(tok_ref, conversations: list[Conversation], cfg: DataConfig, what: str):
    shards = [conversations[i::cfg.shards] for i in range(cfg.shards)]
    pending = [_tokenize_shard_task.remote(tok_ref, shard, cfg.max_length) for shard in shards if shard]
    by_id: dict[str, TokenizedConversation] = {}
    report = ReadReport(source=f"templating ({what})")
    with tqdm(total=len(pending), desc=f"tokenizing {what} on Ray", unit="shard") as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            rows, shard_report = ray.get(done[0])
            by_id.update({r.id: r for r in rows})
            report.merge(shard_report)
            bar.update()
    order = [c.id for c in conversations if c.id in by_id]  # keep the read order, whatever finished first
    return [by_id[i] for i in order], report


def _save(rows: list[TokenizedConversation], conversations: list[Conversation], path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)  # an interrupted attempt's copy
    # The messages travel with the tokens: self-distillation regenerates the assistant turns from them (a corpus's
    # rows have none: they are the base model's own already).
    messages = {c.id: json.dumps(list(c.messages)) for c in conversations}
    Dataset.from_dict({
        "id": [r.id for r in rows],
        "input_ids": [r.input_ids for r in rows],
        "loss_mask": [r.loss_mask for r in rows],
        "messages": [messages.get(r.id, "[]") for r in rows],
    }).save_to_disk(str(path))


def read_corpus_rows(root: Path, base: BaseModelConfig, tokenizer, cfg: DataConfig
                     ) -> tuple[list[TokenizedConversation], ReadReport]:
    """A corpus's conversations as tokenized rows (after checking it is this base model's, shard by shard),
    cut to data.max_length; up to data.limit of them."""
    corpus = open_corpus(root)
    corpus.check_base_model(cached_fingerprint(materialize(base.name)), tokenizer_identity(tokenizer))
    report, rows = ReadReport(source=f"corpus {root}"), []
    for row in stream_rows(corpus):
        if cfg.limit is not None and len(rows) >= cfg.limit:
            break
        mask = row.loss_mask()[: cfg.max_length]
        if not any(mask):
            report.skip(row.id, f"no assistant tokens within max_length={cfg.max_length}")
            continue
        rows.append(TokenizedConversation(row.id, row.input_ids[: cfg.max_length], mask))
        report.keep()
    if not rows:
        raise ValueError(f"no usable conversation in corpus {root}: {report.describe()}")
    return rows, report


def _tokenized_splits(base: BaseModelConfig, cfg: DataConfig, tokenizer):
    """(train rows, held-out rows, train conversations, held-out conversations, read report, templating reports)
    of the source: a corpus's rows as stored, any other source read and templated on Ray tasks."""
    if (root := corpus_source(cfg.source, base.name)) is not None:
        rows, read_report = read_corpus_rows(root, base, tokenizer, cfg)
        train, holdout = split_holdout_by_id(rows, cfg.holdout, cfg.seed)
        stored = tuple(ReadReport(source=f"templating ({what}): none, a corpus is stored tokenized", rows=len(split),
                                  kept=len(split)) for what, split in (("train", train), ("holdout", holdout)))
        return train, holdout, [], [], read_report, stored
    # raises, naming the source and the form expected, when not one row is usable
    conversations, read_report = read_conversations(cfg.source, cfg.limit, require_assistant=True)
    # Conversation ids must be unique to re-order shard results; number duplicates instead of dropping them.
    seen: dict[str, int] = {}
    for i, conv in enumerate(conversations):
        seen[conv.id] = seen.get(conv.id, 0) + 1
        if seen[conv.id] > 1:
            conversations[i] = Conversation(f"{conv.id}#{seen[conv.id]}", conv.messages)
    train_convs, holdout_convs = split_holdout(conversations, cfg.holdout, cfg.seed)
    tok_ref = ray.put(tokenizer)
    train, train_report = _tokenize_on_ray(tok_ref, train_convs, cfg, "train")
    holdout, holdout_report = _tokenize_on_ray(tok_ref, holdout_convs, cfg, "holdout")
    return train, holdout, train_convs, holdout_convs, read_report, (train_report, holdout_report)


def run_data_stage(base: BaseModelConfig, cfg: DataConfig, out_dir: Path) -> dict:
    tokenizer = load_tokenizer(base.name)
    context = getattr(AutoConfig.from_pretrained(materialize(base.name)), "max_position_embeddings", None)
    if context:  # a model family without the field leaves the limit to the model
        cfg.check_context(context)
    train, holdout, train_convs, holdout_convs, read_report, (train_report, holdout_report) = _tokenized_splits(
        base, cfg, tokenizer)
    for report in (train_report, holdout_report):
        log.info(report.describe())
    if not train:
        raise ValueError(f"no training sequence left after templating {cfg.source}: {train_report.describe()}")
    _save(train, train_convs, out_dir / "train")
    _save(holdout, holdout_convs, out_dir / "holdout")

    summary = {
        "read": read_report.summary(),
        "templating": {"train": train_report.summary(), "holdout": holdout_report.summary()},
        "train_sequences": len(train),
        "holdout_sequences": len(holdout),
        "train_tokens": sum(len(r.input_ids) for r in train),
        "train_assistant_tokens": sum(sum(r.loss_mask) for r in train),
        "holdout_assistant_tokens": sum(sum(r.loss_mask) for r in holdout),
        "max_length": cfg.max_length,
        # what the run's Datasets column shows (the pipeline logs them): the splits' rows, digests and counts
        "datasets": [split_record(cfg.source, "training", train, read_report.summary()),
                     *([split_record(cfg.source, "validation", holdout, read_report.summary())] if holdout else [])],
    }
    # the base model scores sequences of given text only: one whose user turns it writes itself holds none yet
    unwritten = {c.id for c in (*train_convs, *holdout_convs) if c.has_turns_to_write()}
    check_rows = [r for r in (holdout or train) if r.id not in unwritten][: cfg.check_sequences]
    if unwritten:
        log.info("%d conversations leave user turns for the base model to write (teacher.regenerate writes them)",
                 len(unwritten))
    if check_rows:
        log.info("base model %s (%s) scores %d held-out sequences on a Ray task", base.name, base.quantization, len(check_rows))
        cpus = max(1, min(4, int(ray.available_resources().get("CPU", 1)), largest_node_cpus()))
        summary.update(ray.get(_score_task.options(num_cpus=cpus).remote(base, check_rows)))
        summary["check_perplexity"] = math.exp(summary["check_nll"])
    return summary
