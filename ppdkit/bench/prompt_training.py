"""Benchmark: supervised prompt-token positions per second, multi-insertion vs one insertion per sequence.

Same base model, same sequences, same process; the two modes alternate batch by batch so drift in
the machine's speed hits both alike. A supervised position is one (insertion point, distance) pair
with a teacher target: what one unit of training signal costs.
"""

import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ppdkit.data_pipeline.teacher_cache import TeacherCache
from ppdkit.models.config import BaseModelConfig
from ppdkit.models.loading import load_base_model
from ppdkit.models.prompt_tokens import PromptTokens, init_from_token_embeddings
from ppdkit.runtime.forward.devices import torch_threads

from ppdkit.trainer.prompt_batch import collate
from ppdkit.trainer.config import PromptTokenConfig
from ppdkit.trainer.losses import prompt_token_loss
from ppdkit.trainer.student import student_logprobs


def _train_step(base_model, prompt: PromptTokens, batch, cfg: PromptTokenConfig) -> None:
    emb, weights = prompt()
    logp = student_logprobs(base_model, emb, weights, cfg.num_prompt_tokens, cfg.num_epts, batch)
    prompt_token_loss(logp, batch, cfg.loss, cfg.alpha).backward()
    prompt.zero_grad(set_to_none=True)


def insertion_benchmark(base_cfg: BaseModelConfig, cfg: PromptTokenConfig, teacher_dir: Path, batches: int = 4,
                        threads: int | None = None) -> dict:
    """Both modes on `batches` micro-batches of the cache's training sequences, on `threads` CPU threads (None: as
    they are) -> the report."""
    with torch_threads(threads):
        return _insertion_benchmark(base_cfg, cfg, teacher_dir, batches)


def _insertion_benchmark(base_cfg: BaseModelConfig, cfg: PromptTokenConfig, teacher_dir: Path, batches: int) -> dict:
    base = load_base_model(base_cfg.name, base_cfg.quantization, base_cfg.dtype, for_training=True)
    cache = TeacherCache(teacher_dir, expect_fingerprint=base.fingerprint)
    seqs = [s for s in cache.sequences("train") if len(s.positions) > 1][: batches * cfg.micro_batch]
    k, n = cfg.num_prompt_tokens, cfg.num_epts
    init = init_from_token_embeddings(base.model.get_input_embeddings(), k, n, cfg.init_token_ids, cfg.seed)
    prompt = PromptTokens(k, n, init.shape[-1], cfg.aggregation, init=init)
    modes = {"one insertion per sequence": 1, f"{cfg.groups_per_sequence} insertions per sequence": cfg.groups_per_sequence}
    totals = {name: {"seconds": 0.0, "positions": 0, "tokens": 0} for name in modes}
    chunks = [seqs[i:i + cfg.micro_batch] for i in range(0, len(seqs), cfg.micro_batch)]
    _train_step(base.model, prompt, collate(chunks[0], k, n, 1, cfg.mask, random.Random(0)), cfg)  # warm-up
    for i, chunk in enumerate(tqdm(chunks, desc="insertion benchmark", unit="batch")):
        for name, groups in modes.items():
            batch = collate(chunk, k, n, groups, cfg.mask, random.Random(i))
            started = time.perf_counter()
            _train_step(base.model, prompt, batch, cfg)
            totals[name]["seconds"] += time.perf_counter() - started
            totals[name]["positions"] += batch.supervised
            totals[name]["tokens"] += int(batch.position_ids.numel())
    rows = [{"mode": name, **t, "positions_per_second": t["positions"] / t["seconds"]} for name, t in totals.items()]
    return {"base_model": base_cfg.name, "quantization": base_cfg.quantization, "batches": len(chunks),
            "micro_batch": cfg.micro_batch, "threads": torch.get_num_threads(), "results": rows,
            "speedup": rows[1]["positions_per_second"] / rows[0]["positions_per_second"]}
