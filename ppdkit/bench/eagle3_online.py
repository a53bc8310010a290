"""Benchmark: EAGLE-3 training positions per second online (train.online: the frozen base computes each sequence's
targets and states in the step) against precomputed (what a teacher cache with the states kept gives a step).

Same draft, same sequences, same process; the two modes alternate batch by batch so drift in the machine's speed hits
both alike. The online mode keeps nothing: every sequence of every batch costs the base's forward, as one epoch over a
corpus larger than a worker's memory does. The precomputed mode's targets and states come from the same forward, run
before the clock starts: it leaves out the teacher stage that made them and the reading of them from disk.
"""

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ppdkit.data_pipeline.teacher_cache import ShardSequence
from ppdkit.models.loading import load_base_model
from ppdkit.runtime.forward.devices import torch_threads
from ppdkit.runtime.forward.precision import resolve_dtype

from .head_features import train_step
from ppdkit.trainer.training_methods import TRAINING_METHODS
from ppdkit.trainer.online_teacher import OnlineTeacher

MODES = ("precomputed (a teacher cache)", "online (the base in the step)")


@dataclass
class _Precomputed(ShardSequence):
    features_layer: int | tuple[int, ...] | None = None


def online_benchmark(base_cfg, cfg, teacher_cfg, data_dir: Path, batches: int = 4, threads: int | None = None) -> dict:
    """Both modes on `batches` micro-batches (after one of warm-up) of the data stage's training rows in `data_dir`,
    on `threads` CPU threads (None: as they are) -> the report."""
    with torch_threads(threads):
        return _online_benchmark(base_cfg, cfg, teacher_cfg, data_dir, batches)


def _online_benchmark(base_cfg, cfg, teacher_cfg, data_dir: Path, batches: int) -> dict:
    if cfg.method != "eagle3":
        raise ValueError(f"ppdkit bench-online measures eagle3, not {cfg.method}: set train.method=eagle3")
    dtype = resolve_dtype(teacher_cfg.compute_dtype)
    base = load_base_model(base_cfg.name, base_cfg.quantization, dtype, for_training=True)
    teacher = OnlineTeacher(base.model, teacher_cfg.top_k, keep_bytes=0)  # nothing kept past a batch: every visit
    # computes, as on a corpus larger than a worker's memory
    wanted = (batches + 1) * cfg.micro_batch
    seqs = teacher.split(data_dir, "train")[:wanted]
    if len(seqs) < wanted:
        raise ValueError(f"{data_dir} has {len(seqs)} training sequences: the benchmark needs {wanted}")
    run = TRAINING_METHODS[cfg.method].start(cfg, base, seqs, teacher=teacher)
    optimizer = torch.optim.AdamW(run.module.parameters(), lr=cfg.lr)

    def step(chunk, seed: int) -> int:
        return train_step(run, optimizer, chunk, seed)

    def precomputed(seq) -> _Precomputed:
        return _Precomputed(seq.row, seq.input_ids, seq.positions, seq.topk_ids, seq.topk_logprobs, seq.rest_mass,
                            seq.features, teacher.layer)

    chunks = [seqs[i:i + cfg.micro_batch] for i in range(0, len(seqs), cfg.micro_batch)]
    step(chunks[0], 0)  # warm-up
    totals = {name: {"seconds": 0.0, "positions": 0, "tokens": 0} for name in MODES}
    for i, chunk in enumerate(tqdm(chunks[1:], desc="online benchmark", unit="batch"), start=1):
        ready = [precomputed(s) for s in chunk]  # the base's forward, off the clock
        teacher.forget()  # the online mode computes them again, on the clock
        for name, sequences in zip(MODES, (ready, chunk)):
            started = time.perf_counter()
            totals[name]["positions"] += step(sequences, i)
            totals[name]["seconds"] += time.perf_counter() - started
            totals[name]["tokens"] += sum(len(s.input_ids) for s in sequences)
    rows = [{"mode": name, **t, "positions_per_second": t["positions"] / t["seconds"]} for name, t in totals.items()]
    return {"base_model": base_cfg.name, "compute_dtype": dtype, "engine": teacher.engine, "method": cfg.method,
            "precision": "bf16-autocast" if run.autocast else "fp32", "batches": len(chunks) - 1,
            "micro_batch": cfg.micro_batch, "top_k": teacher_cfg.top_k, "base_forwards": teacher.forwards, "threads": torch.get_num_threads(),
            "results": rows, "speedup": rows[0]["positions_per_second"] / rows[1]["positions_per_second"]}
