"""Full training state, saved every N steps and on demand, in safetensors + JSON (no pickle).

    OUT/checkpoints/step-000050/rank-0.{json,safetensors}   module, optimizer, scheduler of that rank
    OUT/checkpoints/step-000050/meta.json                   step, loss history, best so far
    OUT/checkpoints/latest.json                             the newest complete checkpoint

A checkpoint counts once `latest.json` names it (written last by rank 0, after every rank saved), so
a crash while saving leaves the previous one in force. Data order and insertion points are derived
from (seed, epoch, step), so the step number is the whole data position. Every file is written to a
temporary name and renamed, and `OUT/best` is replaced by renames: a SIGKILL at any point leaves whole
files, and `restore_best` mends the one gap a crash can leave (the best copy not yet made).
"""

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from ppdkit.models.paths import write_json_atomic
from ppdkit.models.state_io import load_state, save_state


def _optimizer_state(engine) -> dict:
    opt = engine.optimizer
    if engine.zero_optimization_stage() == 0:
        return {"torch": opt.state_dict()}
    # ZeRO 1/2: this rank's fp32 partition and the wrapped torch optimizer's moments over it.
    return {"torch": opt.optimizer.state_dict(), "fp32_partitions": list(opt.single_partition_of_fp32_groups)}


def _load_optimizer_state(engine, state: dict) -> None:
    opt = engine.optimizer
    if engine.zero_optimization_stage() == 0:
        opt.load_state_dict(state["torch"])
        return
    opt.optimizer.load_state_dict(state["torch"])
    # The module's own parameters were restored whole just before; the partitions must agree with them.
    for mine, saved in zip(opt.single_partition_of_fp32_groups, state["fp32_partitions"]):
        mine.data.copy_(saved)


def save_checkpoint(root: Path, step: int, engine, rank: int, meta: dict[str, Any], barrier) -> Path:
    directory = root / f"step-{step:06d}"
    directory.mkdir(parents=True, exist_ok=True)
    save_state({"module": engine.module.state_dict(), "optimizer": _optimizer_state(engine),
                "scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler else None,
                "torch_rng": torch.get_rng_state()}, directory / f"rank-{rank}")
    barrier()
    if rank == 0:
        write_json_atomic(directory / "meta.json", {"step": step, **meta})
        write_json_atomic(root / "latest.json", {"step": step, "dir": directory.name})
    barrier()
    return directory


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / "latest.json"
    if not pointer.is_file():
        return None
    return root / json.loads(pointer.read_text())["dir"]


def load_checkpoint(directory: Path, engine, rank: int) -> dict[str, Any]:
    """Restore this rank's state; returns the checkpoint's meta (step, history, best)."""
    state = load_state(directory / f"rank-{rank}")
    engine.module.load_state_dict(state["module"], strict=True)
    _load_optimizer_state(engine, state["optimizer"])
    if engine.lr_scheduler and state["scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    return json.loads((directory / "meta.json").read_text())


def replace_dir(tmp: Path, final: Path) -> None:
    """Put the complete directory `tmp` in place of `final` by renames, never deleting `final` before
    its replacement is whole: a crash leaves the old directory, the new one, or (between the renames)
    none and `final.old`."""
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def keep_as_best(directory: Path, best_dir: Path) -> None:
    tmp = best_dir.with_name(best_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # a copy a crash interrupted
    shutil.copytree(directory, tmp)
    replace_dir(tmp, best_dir)


def restore_best(root: Path, best_dir: Path, step: int | None) -> None:
    """On resume (rank 0): make `best_dir` hold checkpoint `step`, the best as of the checkpoint resumed
    from. A crash after that checkpoint was named latest but before (or while) it was copied left an
    older copy or none; the checkpoint itself is still there, as pruning comes after the copy."""
    if step is None:
        return
    try:
        kept = json.loads((best_dir / "meta.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        kept = None
    source = root / f"step-{step:06d}"
    if kept != step and source.is_dir():
        keep_as_best(source, best_dir)


def prune(root: Path, keep: int = 2) -> None:
    steps = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
