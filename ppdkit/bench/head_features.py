"""Benchmark: head-training positions per second with the base model's features read from the teacher cache
(teacher.features) against features computed by the base model's forward, as a cache without them makes training do.

Same heads, same sequences, same process; the two modes alternate batch by batch so drift in the machine's
speed hits both alike. The computed mode runs the base forward for every sequence of every batch: what one epoch
over a large cache costs, where each sequence is seen once (trainer/features.py keeps a computed sequence only
for the epochs after). The base computes in the dtype the teacher did, as the training workers do.
"""

import dataclasses
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ppdkit.data_pipeline.teacher_cache import TeacherCache, TeacherCacheError
from ppdkit.models.config import BaseModelConfig
from ppdkit.models.draft_heads import HEAD_KINDS
from ppdkit.models.loading import load_base_model
from ppdkit.runtime.forward.devices import torch_threads

from ppdkit.trainer.config import HeadConfig
from ppdkit.trainer.training_methods import TRAINING_METHODS

MODES = ("features read from the cache", "features computed by the base")


def feature_bytes(cache: TeacherCache) -> dict:
    """The feature cache's size: bytes on disk, and per supervised position of the teacher cache."""
    records = cache.shards()
    size = sum(r["features"]["bytes"] for r in records)
    positions = sum(r["positions"] for r in records)
    return {"feature_bytes": size, "positions": positions, "feature_bytes_per_position": size / max(positions, 1)}


def train_step(run, optimizer, chunk: list, seed: int) -> int:
    """One optimizer step of `run` on `chunk` outside DeepSpeed (a benchmark's); returns its supervised positions."""
    loss, positions = run.loss(run.module, chunk, random.Random(seed), 0)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return positions


def features_benchmark(base_cfg: BaseModelConfig, cfg: HeadConfig, teacher_dir: Path, batches: int = 4,
                       threads: int | None = None) -> dict:
    """Both modes on `batches` micro-batches (after one of warm-up), on `threads` CPU threads (None: as they are)
    -> the report."""
    with torch_threads(threads):
        return _features_benchmark(base_cfg, cfg, teacher_dir, batches)


def _features_benchmark(base_cfg: BaseModelConfig, cfg: HeadConfig, teacher_dir: Path, batches: int) -> dict:
    method = TRAINING_METHODS[cfg.method]
    if method.head_kind not in HEAD_KINDS:
        raise ValueError(f"train.method {cfg.method} trains no head over the base's features: use one of "
                         f"{', '.join(m.name for m in TRAINING_METHODS.values() if m.head_kind in HEAD_KINDS)}")
    cache = TeacherCache(teacher_dir)
    if not cache.has_features:
        raise TeacherCacheError(f"{teacher_dir} keeps no features to compare with: run the teacher stage with "
                                "teacher.features=true")
    base = load_base_model(base_cfg.name, base_cfg.quantization, cache.float_dtype, for_training=True)
    cache.check_base(base.fingerprint)
    seqs = []
    for seq in cache.sequences("train", features=True):
        if len(seq.positions) > 1:
            seqs.append(seq)
        if len(seqs) == (batches + 1) * cfg.micro_batch:  # one more batch: the warm-up
            break
    if len(seqs) < 2 * cfg.micro_batch:
        raise ValueError(f"{teacher_dir} has {len(seqs)} training sequences: the benchmark needs a warm-up batch and one "
                         f"more of train.micro_batch={cfg.micro_batch}")
    run = method.start(cfg, base, seqs, teacher=cache)
    optimizer = torch.optim.AdamW(run.module.parameters(), lr=cfg.lr)
    chunks = [seqs[i:i + cfg.micro_batch] for i in range(0, len(seqs), cfg.micro_batch)]

    def step(chunk, seed: int) -> int:
        return train_step(run, optimizer, chunk, seed)

    step(chunks[0], 0)  # warm-up
    totals = {name: {"seconds": 0.0, "positions": 0} for name in MODES}
    for i, chunk in enumerate(tqdm(chunks[1:], desc="features benchmark", unit="batch"), start=1):
        bare = [dataclasses.replace(s, features=None) for s in chunk]  # each sequence is in one batch only
        for name, sequences in zip(MODES, (chunk, bare)):
            started = time.perf_counter()
            totals[name]["positions"] += step(sequences, i)
            totals[name]["seconds"] += time.perf_counter() - started
    rows = [{"mode": name, **t, "positions_per_second": t["positions"] / t["seconds"]} for name, t in totals.items()]
    return {"base_model": base_cfg.name, "quantization": base_cfg.quantization, "compute_dtype": cache.compute_dtype,
            "method": cfg.method, "batches": len(chunks) - 1, "micro_batch": cfg.micro_batch,
            "groups_per_sequence": cfg.groups_per_sequence, "threads": torch.get_num_threads(), "results": rows,
            "speedup": rows[0]["positions_per_second"] / rows[1]["positions_per_second"], **feature_bytes(cache)}
