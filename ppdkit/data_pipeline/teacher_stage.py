"""The `teacher` stage: Ray actors holding the FROZEN base model write the compressed teacher cache.

One forward over a sequence gives every position's next-token distribution: the target for a prompt
token at distance i inserted after position t is the distribution at t+i. Only positions whose next
token is the assistant's are kept.

Exactly once and resumable: each shard is written atomically and then recorded in the manifest, which
the driver rewrites atomically after every shard. A rerun computes only the shards the manifest lacks
(a shard file the manifest does not list, e.g. written by an actor after its driver was killed, is
computed again and replaced by identical bytes); an actor that dies is restarted by Ray and its shard
retried. Shard contents are deterministic (fixed batch composition, fixed seeds, fixed thread count),
so a retried shard is byte-identical.
"""

import hashlib
import json
import logging
import os
import shutil
import time
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import ray
import torch
from datasets import load_from_disk
from tqdm import tqdm

from ppdkit.models.config import BaseModelConfig
from ppdkit.models.loading import load_base_model
from ppdkit.models.paths import write_json_atomic
from ppdkit.runtime.drafters.drafter import read_prompt
from ppdkit.runtime.decoder_loading import base_weights
from ppdkit.runtime.forward.dtypes import BLOCK_FORMATS
from ppdkit.runtime.forward.llama import LeanLlama
from ppdkit.runtime.forward.precision import resolve_dtype

from .config import DataConfig, TeacherConfig
from .conversations import Conversation, MalformedRow, ReadReport, to_write
from .ray_placement import Placement, actor_strategy, describe, this_node
from .regenerate import regenerate_conversations, regeneration_runtime
from .teacher_cache import (FORMAT, ShardSequence, compress_head, compress_logits, mass_figures, read_rest_mass,
                            write_shard)
from .templating import encode_conversation, supervised_positions
from .throughput import Throughput
from .worker_log import log_to_file
from .worker_memory import bound_kernel_caches, release_freed_memory

log = logging.getLogger(__name__)

SPLITS = ("train", "holdout")


def _has_turns_to_write(row: dict) -> bool:
    try:
        return any(map(to_write, json.loads(row.get("messages") or "[]")))
    except (TypeError, ValueError, AttributeError):
        return False  # no readable messages: check_row judges its tokens


def check_row(row: dict, vocab_size: int) -> None:
    ids, mask = row.get("input_ids"), row.get("loss_mask")
    if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
        raise MalformedRow("input_ids and loss_mask are not lists of one length")
    if len(ids) < 2:
        raise MalformedRow("fewer than 2 tokens")
    if any((not isinstance(t, int)) or t < 0 or t >= vocab_size for t in ids):
        raise MalformedRow(f"a token id outside the base model's vocabulary (0..{vocab_size - 1})")
    if not supervised_positions(mask):
        raise MalformedRow("no assistant token to predict")


def teacher_sequences(model, rows: list[dict], k: int, batch_size: int, features: bool = False) -> list[ShardSequence]:
    """Forward `rows` in fixed batches (right padding, so real positions are unaffected) and compress.

    The LM head runs only on the supervised positions: user turns cost no vocabulary projection. `features`
    keeps each sequence's final hidden states [T, H] too (in float16), which the forward computed anyway.
    """
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    out = []
    for i in range(0, len(rows), batch_size):
        batch = rows[i:i + batch_size]
        longest = max(len(r["input_ids"]) for r in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)  # [B, T]
        attention = torch.zeros(len(batch), longest, dtype=torch.long)  # [B, T]
        for b, r in enumerate(batch):
            ids[b, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
            attention[b, :len(r["input_ids"])] = 1
        with torch.inference_mode():  # on the model's device (a GPU's, models/device_plan.py); the shard on the CPU
            hidden = decoder(input_ids=ids.to(model.device),
                             attention_mask=attention.to(model.device)).last_hidden_state  # [B, T, H]
            for b, r in enumerate(batch):
                positions = torch.tensor(supervised_positions(r["loss_mask"]), dtype=torch.long)  # [P]
                compressed = compress_logits(head(hidden[b, positions.to(hidden.device)]), k)  # [P, V] -> top-k
                topk_ids, topk_logprobs, rest = (part.cpu() for part in compressed)
                n = len(r["input_ids"])
                out.append(ShardSequence(row=r["row"], input_ids=ids[b, :n], positions=positions,
                                         topk_ids=topk_ids, topk_logprobs=topk_logprobs, rest_mass=rest,
                                         features=hidden[b, :n].to(torch.float16).cpu() if features else None))
    return out


def runtime_teacher_sequences(model: LeanLlama, rows: list[dict], k: int, features: bool = False
                              ) -> list[ShardSequence]:
    """The teacher pass on the decoder's own runtime (a block-format teacher, whose weights transformers cannot
    multiply): each row read as `ar` reads a prompt, its LM head on the supervised positions only. Its targets are
    therefore the model `--dtype gguf` (or q4) verifies with."""
    out = []
    with torch.inference_mode():
        for r in rows:
            ids = torch.tensor(r["input_ids"], dtype=torch.long)  # [T]
            hidden = read_prompt(model, ids, model.new_cache(len(ids)))  # [T, H]
            positions = torch.tensor(supervised_positions(r["loss_mask"]), dtype=torch.long)  # [P]
            topk_ids, topk_logprobs, rest = compress_head(model.logits, hidden[positions], k)  # [P, H] -> top-k
            out.append(ShardSequence(row=r["row"], input_ids=ids, positions=positions, topk_ids=topk_ids,
                                     topk_logprobs=topk_logprobs, rest_mass=rest,
                                     features=hidden.to(torch.float16) if features else None))
    return out


@ray.remote(max_restarts=3, max_task_retries=3)
class TeacherWorker:
    """Holds one frozen base model; turns shards of rows into shard files."""

    def __init__(self, base: BaseModelConfig, cfg: TeacherConfig, max_length: int, threads: int, log_file: str):
        bound_kernel_caches()  # first: before any oneDNN kernel is made
        torch.set_num_threads(threads)
        log_to_file(Path(log_file))
        started = time.time()
        self.dtype = resolve_dtype(cfg.compute_dtype)  # on the actor: its own CPU decides what auto means
        if self.dtype in BLOCK_FORMATS:  # transformers cannot multiply blocks: both passes on the runtime
            self.base, blocks = base_weights(base.name, self.dtype)
            self.runtime = LeanLlama(self.base.model, max_length + 1, quantized=blocks, weight_format=self.dtype)
        else:
            self.base = load_base_model(base.name, base.quantization, self.dtype)
            wanted = cfg.regenerate or base.quantization == "none"
            self.runtime = regeneration_runtime(self.base, base, self.dtype, max_length) if wanted else None
        # The teacher pass on the runtime wherever it holds the teacher's own model (not a 4-bit NF4 teacher's
        # unquantized copy): the targets and features are then those of the model the decoder verifies with, and a
        # bfloat16 pass took half the time of transformers' on a CPU without AMX (pipeline.md).
        self.on_runtime = self.runtime is not None and (self.dtype in BLOCK_FORMATS or base.quantization == "none")
        self.node = this_node()
        log.info("teacher worker (pid %d): %s (%s, %s) loaded in %.1f s on %d threads; teacher pass on %s; "
                 "regeneration on %s", os.getpid(), base.name, base.quantization, self.dtype, time.time() - started,
                 threads, teacher_engine(self.on_runtime),
                 "no" if not cfg.regenerate else "the runtime (batched)" if self.runtime else "transformers' generate")

    def ready(self) -> dict:
        vocab = sorted(self.base.tokenizer.get_vocab().items())
        return {"pid": os.getpid(), "node": self.node, "fingerprint": self.base.fingerprint,
                "compute_dtype": self.dtype,
                "regeneration_engine": regeneration_engine(self.runtime),
                "teacher_engine": teacher_engine(self.on_runtime),
                "vocab_size": self.base.model.config.vocab_size,
                "tokenizer": {"class": type(self.base.tokenizer).__name__, "size": len(vocab),
                              "vocab_sha256": hashlib.sha256(json.dumps(vocab).encode()).hexdigest()}}

    def process(self, job: dict) -> dict:
        cfg: TeacherConfig = job["cfg"]
        report = ReadReport(source=f"teacher {job['shard_id']}")
        rows = job["rows"]
        generated, started = Counter(), time.time()
        if cfg.regenerate:
            rows = self._regenerate(rows, cfg, job["max_length"], job["seed"], report, generated)
        generate_seconds = time.time() - started
        good = []
        for r in rows:
            try:
                if not cfg.regenerate and _has_turns_to_write(r):  # its tokens hold an empty user turn
                    raise MalformedRow("a user turn is marked write, for the base model to write: set "
                                       "teacher.regenerate true")
                check_row(r, self.base.model.config.vocab_size)
                good.append(r)
                report.keep()
            except MalformedRow as e:
                report.skip(f"row {r['row']}", str(e))
        started = time.time()
        sequences = (runtime_teacher_sequences(self.runtime, good, cfg.top_k, cfg.features) if self.on_runtime else
                     teacher_sequences(self.base.model, good, cfg.top_k, cfg.batch_size, cfg.features))
        record = write_shard(Path(job["path"]), sequences, self.base.model.config.vocab_size, cfg.dtype, cfg.features)
        teacher_seconds = time.time() - started
        release_freed_memory()  # a shard's tensors of every length, freed
        log.info("shard %s: %d sequences, %d positions (%.0f/s), %d tokens generated (%.0f/s), %d rows skipped",
                 job["shard_id"], len(sequences), record["positions"], record["positions"] / max(teacher_seconds, 1e-9),
                 generated.total(), generated.total() / max(generate_seconds, 1e-9), sum(report.skipped.values()))
        record.update(split=job["split"], index=job["index"], rows=job["row_range"], skipped=dict(report.skipped),
                      skipped_examples=report.examples, generated_tokens=generated.total(),
                      # who computed it and how fast: the one part of a record that differs between two runs
                      timing={"worker": os.getpid(), "node": self.node["node"],
                              "generate_seconds": round(generate_seconds, 3),
                              "teacher_seconds": round(teacher_seconds, 3)})
        return record

    def _regenerate(self, rows: list[dict], cfg: TeacherConfig, max_length: int, seed: int,
                    report: ReadReport, generated: Counter) -> list[dict]:
        convs, usable = [], []
        for r in rows:
            try:
                convs.append(Conversation(str(r["row"]), tuple(json.loads(r["messages"]))))
                usable.append(r)
            except (TypeError, ValueError, KeyError) as e:
                report.skip(f"row {r.get('row')}", f"no usable messages to regenerate from ({e.__class__.__name__})")
        new = regenerate_conversations(self.base.model, self.base.tokenizer, convs, max_new_tokens=cfg.max_new_tokens,
                                       max_length=max_length, temperature=cfg.temperature, seed=seed,
                                       batch_size=cfg.generate_batch, runtime=self.runtime,
                                       prompt_temperature=cfg.prompt_temperature,
                                       on_tokens=lambda n: generated.update(tokens=n))
        out = []
        for r, conv in zip(usable, new):
            if not conv.messages:  # its first turn was to be written, and the model wrote nothing
                report.skip(f"row {r['row']}", "regenerated: the model wrote an empty prompt")
                continue
            try:
                enc = encode_conversation(self.base.tokenizer, conv, max_length)
            except MalformedRow as e:
                report.skip(f"row {r['row']}", f"regenerated: {e}")
                continue
            out.append({**r, "input_ids": enc.input_ids, "loss_mask": enc.loss_mask,
                        "messages": json.dumps(list(conv.messages))})
        return out


def regeneration_engine(runtime: LeanLlama | None) -> str:
    return "runtime" if runtime is not None else "transformers"


def teacher_engine(on_runtime: bool) -> str:
    return "runtime" if on_runtime else "transformers"


def plan_shards(split_sizes: dict[str, int], rows_per_shard: int) -> list[dict]:
    """Every shard of every split: which rows it covers. The plan depends only on the data."""
    plan = []
    for split in SPLITS:
        n = split_sizes.get(split, 0)
        for index, start in enumerate(range(0, n, rows_per_shard)):
            plan.append({"shard_id": f"{split}-{index:05d}", "split": split, "index": index,
                         "row_range": [start, min(start + rows_per_shard, n)]})
    return plan


MANIFEST_RECORDS = ("shards", "complete", "figures")  # what a run writes beside its header


def _header(base: BaseModelConfig, cfg: TeacherConfig, data: DataConfig, worker_info: dict) -> dict:
    # What makes two caches interchangeable: a shard from a cache with another header is never reused.
    return {"format": FORMAT, "base_model": base.name, "quantization": base.quantization,
            "dtype_model": worker_info["compute_dtype"], "teacher_engine": worker_info["teacher_engine"],
            "fingerprint": worker_info["fingerprint"], "vocab_size": worker_info["vocab_size"], "tokenizer": worker_info["tokenizer"],
            "top_k": cfg.top_k, "dtype": cfg.dtype, "rows_per_shard": cfg.rows_per_shard, "features": cfg.features,
            "batch_size": cfg.batch_size, "regenerate": cfg.regenerate,
            "generation": {"max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "seed": cfg.seed,
                           "engine": worker_info["regeneration_engine"],
                           # only where every prompt is written (caches of other sources keep their headers)
                           **({"prompt_temperature": cfg.prompt_temperature}
                              if data.source.startswith("magpie") else {}),
                           # fixed batches of transformers' generate may change a row with its neighbours
                           **({"batch": cfg.generate_batch} if worker_info["regeneration_engine"] != "runtime" else {})}
            if cfg.regenerate else None, "max_length": data.max_length}


def _resume_manifest(path: Path, header: dict, out_dir: Path) -> dict:
    """The manifest to continue: the saved one if it was made with the same header, else a fresh one."""
    manifest = json.loads(path.read_text()) if path.is_file() else None
    # compared both ways: a setting the saved header has and this one lacks (dropped or renamed since) differs too
    if manifest is None or {k: v for k, v in manifest.items() if k not in MANIFEST_RECORDS} != header:
        if manifest is not None:
            log.warning("teacher: %s was started with other settings; starting the cache afresh", out_dir)
        for split in SPLITS:
            shutil.rmtree(out_dir / split, ignore_errors=True)
        manifest = {**header, "shards": {}, "complete": False}
    for split in SPLITS:
        (out_dir / split).mkdir(exist_ok=True)
    _remove_partial_shards(out_dir)
    # A recorded shard counts only while its file is there.
    manifest["shards"] = {sid: rec for sid, rec in manifest["shards"].items()
                          if all((out_dir / rec["split"] / entry["file"]).is_file()
                                 for entry in (rec, rec.get("features")) if entry)}
    return manifest


def _remove_partial_shards(out_dir: Path) -> None:
    """What an actor killed mid-write left (write_shard's temporary files, named by the writer's pid): an actor lost
    with its node, or one a killed driver left writing."""
    for split in SPLITS:
        for partial in (out_dir / split).glob(".*.tmp"):
            partial.unlink(missing_ok=True)


def _compute(workers: list, jobs: list[dict], manifest: dict, manifest_path: Path, expected: int | None,
             on_done: Callable[[dict], None], progress: Callable[[dict[str, float], int], None] | None) -> Throughput:
    """Run `jobs` on the actors, recording each finished shard; returns what they did.

    A shard whose actor was lost (killed, or gone with its node) is computed again, to the same bytes: on the same
    actor once Ray has restarted it where there is room, or, once the actor is out of restarts, on the others."""
    queue, in_flight, done = list(jobs), {}, Throughput()
    live = list(workers)

    def submit(worker) -> None:
        if queue:
            job = queue.pop(0)
            in_flight[worker.process.remote(job)] = (worker, job)

    unit, total = ("pos", expected) if expected is not None else ("shard", len(jobs))
    with tqdm(total=total, desc="teacher pass", unit=unit, unit_scale=True) as bar:
        for worker in workers:  # two shards queued per actor, so a restarted actor has work waiting
            submit(worker)
            submit(worker)
        while in_flight:
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            worker, job = in_flight.pop(ready[0])
            try:
                record = ray.get(ready[0])
            except ray.exceptions.RayActorError as e:
                queue.insert(0, job)
                if isinstance(e, ray.exceptions.ActorDiedError):  # out of restarts: the others take its shards
                    live.remove(worker)
                    if not live:
                        raise
                    worker = min(live, key=lambda w: sum(v[0] is w for v in in_flight.values()))
                log.warning("teacher: shard %s lost with its actor (%s); computing it again", job["shard_id"],
                            type(e).__name__)
                submit(worker)
                continue
            manifest["shards"][f"{record['split']}-{record['index']:05d}"] = record
            write_json_atomic(manifest_path, manifest)
            done.add(record)
            figures = done.figures(len(queue) + len(in_flight))
            bar.update(record["positions"] if expected is not None else 1)
            bar.set_postfix({k: f"{figures[k]:.0f}" for k in ("positions_per_s", "generated_tokens_per_s") if k in figures})
            if progress:
                progress(figures, len(manifest["shards"]))  # the step counts the resumed shards too
            on_done(record)
            submit(worker)
    return done


def run_teacher_stage(base: BaseModelConfig, data: DataConfig, cfg: TeacherConfig, data_dir: Path, out_dir: Path,
                      on_shard_done: Callable[[dict, list[int]], None] | None = None,
                      progress: Callable[[dict[str, float], int], None] | None = None,
                      placement: Placement = "spread") -> dict:
    """Compute every shard the manifest lacks; returns the stage's figures.

    `on_shard_done(record, worker_pids)` is called after each shard is recorded (tests use it to kill
    a worker process or to stop the driver mid-run). `progress(figures, shards_done)` gets the live figures
    (positions and generated tokens per second, per worker, the ETA) after each shard: the pipeline logs them
    to MLflow while the stage runs. `placement` (ray.placement) spreads the actors over the nodes or packs them.
    An actor lost with its node is restarted by Ray where there is room, and its shards retried there.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / "manifest.json"
    splits = {split: load_from_disk(str(data_dir / split)) for split in SPLITS if (data_dir / split).exists()}
    plan = plan_shards({split: len(rows) for split, rows in splits.items()}, cfg.rows_per_shard)

    def job(p: dict) -> dict:
        rows = splits[p["split"]].select(range(*p["row_range"]))
        return {**p, "cfg": cfg, "max_length": data.max_length,
                "seed": zlib.crc32(f"{cfg.seed}:{p['shard_id']}".encode()),
                "path": str(out_dir / p["split"] / f"{p['shard_id']}.safetensors"),
                "rows": [{**r, "row": p["row_range"][0] + i} for i, r in enumerate(rows)]}

    workers = [TeacherWorker.options(num_cpus=cfg.cpus_per_worker, scheduling_strategy=actor_strategy(placement))
               .remote(base, cfg, data.max_length, cfg.cpus_per_worker, str(out_dir / f"worker-{i}.log"))
               for i in range(cfg.workers)]
    try:
        started = time.time()
        infos = ray.get([w.ready.remote() for w in workers])
        startup_seconds = time.time() - started
        for i, info in enumerate(infos):
            log.info("teacher: worker %d (pid %d) on %s", i, info["pid"], describe(info["node"]))
        manifest = _resume_manifest(manifest_path, _header(base, cfg, data, infos[0]), out_dir)
        todo = [p for p in plan if p["shard_id"] not in manifest["shards"]]
        log.info("teacher: %d shards planned, %d already done, %d to compute on %d workers",
                 len(plan), len(plan) - len(todo), len(todo), len(workers))
        expected = None if cfg.regenerate else sum(
            len(supervised_positions(m)) for p in todo for m in splits[p["split"]].select(range(*p["row_range"]))["loss_mask"])
        pids = [info["pid"] for info in infos]
        done = _compute(workers, [job(p) for p in todo], manifest, manifest_path, expected,
                        lambda record: on_shard_done and on_shard_done(record, pids), progress)
    finally:
        for w in workers:
            ray.kill(w)
    _remove_partial_shards(out_dir)
    if done.by_node:
        log.info("teacher: shards computed now, by node: %s",
                 ", ".join(f"{node} {n}" for node, n in sorted(done.by_node.items())))

    figures = cache_figures(out_dir, manifest)
    manifest.update(complete=True, figures=figures)
    write_json_atomic(manifest_path, manifest)
    skipped: dict[str, int] = {}
    for rec in manifest["shards"].values():
        for reason, n in rec["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + n
    return {**figures, "shards": len(manifest["shards"]), "shards_computed_now": len(todo), "workers": cfg.workers,
            "fingerprint": manifest["fingerprint"], "top_k": cfg.top_k, "regenerate": cfg.regenerate,
            "skipped_rows": sum(skipped.values()), "skipped_by_reason": skipped,
            "worker_startup_seconds": round(startup_seconds, 2), **done.summary(computed=bool(todo)),
            "compute_dtype": manifest["dtype_model"], "teacher_engine": manifest["teacher_engine"],
            "regeneration_engine": (manifest["generation"] or {}).get("engine")}


def cache_figures(out_dir: Path, manifest: dict) -> dict:
    records = list(manifest["shards"].values())
    positions = sum(r["positions"] for r in records)
    size = sum(r["bytes"] for r in records)
    feature_bytes = sum(r["features"]["bytes"] for r in records if "features" in r)
    full = manifest["vocab_size"] * 2
    rest = torch.cat([read_rest_mass(out_dir / r["split"] / r["file"]) for r in records]) if records else torch.zeros(0)
    per_split = {split: {"sequences": sum(r["sequences"] for r in records if r["split"] == split),
                         "positions": sum(r["positions"] for r in records if r["split"] == split)} for split in SPLITS}
    return {"positions": positions, "bytes": size, "bytes_per_position": size / max(positions, 1),
            "full_vocab_fp16_bytes_per_position": full,
            "fraction_of_full_vocab": size / max(positions, 1) / full, **mass_figures(rest), "splits": per_split,
            **({"feature_bytes": feature_bytes, "feature_bytes_per_position": feature_bytes / max(positions, 1)}
               if feature_bytes else {})}
