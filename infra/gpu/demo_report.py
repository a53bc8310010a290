"""What ran when infra/gpu/demo-job.sh ran the demo job on a GPU machine: OUT/demo.json.

infra/gpu/README.md says how it gets there.

    demo_report.py preflight --out OUT --site SITE
                                         the GPU, the versions there, what the carried wheels in SITE need of the
                                         image that it lacks, this process's device plan and a check of each device
                                         choice, before the job (each check's error is recorded, never raised)
    demo_report.py collect --out OUT --run DIR --exit-code N --started EPOCH
                                         the job's exit code, wall time and every stage's summary.json; the job log's
                                         lines about devices; MLflow's sqlite store beside it when it fits
What comes back through the device tool is at most 8 files of 16 MiB each: demo.json, job.log and mlflow.db.
"""

import argparse
import dataclasses
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PACKAGES = ("torch", "transformers", "accelerate", "ray", "deepspeed", "mlflow-skinny", "bitsandbytes", "pydantic",
            "datasets", "pyarrow", "gguf", "numpy", "huggingface-hub", "safetensors")
MAX_BACK = 15 * 2**20  # under the device tool's 16 MiB a file
DEVICE_LINE = re.compile(r"accelerator|nccl|gloo|cuda|GPU|device_map|regenerat", re.IGNORECASE)


def _checked(check: Callable[[], object]) -> dict:
    started = time.time()
    try:
        return {"ok": True, "value": check(), "seconds": round(time.time() - started, 2)}
    except Exception as e:  # a failed check is a finding, and the others still run
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000], "seconds": round(time.time() - started, 2)}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _nvidia_smi() -> str:
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    return subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def _ray_gpus() -> int:
    # what the embedded Ray will offer Ray Train: a training rank with use_gpu waits for a GPU Ray does not see
    from ray._private.accelerators import get_accelerator_manager_for_resource

    return get_accelerator_manager_for_resource("GPU").get_current_node_num_accelerators()


def _deepspeed_accelerator(plan) -> str:
    os.environ.setdefault("DS_ACCELERATOR", plan.deepspeed_accelerator)  # as trainer/worker.py sets it
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name()


def _nf4_base(cpu_inputs: bool) -> dict:
    """SmolLM2 in NF4 where the plan loads it, one forward of ids on its device (or left on the CPU, as the call
    sites that do not move them leave them)."""
    import torch

    from ppdkit.models.loading import load_base_model

    base = load_base_model("smollm2-135m", "nf4", "bfloat16")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        logits = base.model(ids if cpu_inputs else ids.to(base.model.device)).logits
    return {"device": str(base.model.device), "logits": list(logits.shape), "finite": bool(logits.isfinite().all())}


def _unmet_in_the_image(site: Path) -> list[dict]:
    """What the carried packages in `site` require of the image's own that its versions do not give: the image's
    versions were not known when the wheels were chosen (demo_wheels.py pins only what it carries)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from demo_wheels import NO_DEPENDENCIES, ROOTS, device_environment

    extras = {canonicalize_name(r.name): r.extras for r in map(Requirement, ROOTS)}
    carried = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions(path=[str(site)])}
    unmet = []
    for name, dist in sorted(carried.items()):
        for req in map(Requirement, [] if name in NO_DEPENDENCIES else dist.requires or []):
            wanted = {"", *extras.get(name, ())}
            if req.marker is not None and not any(req.marker.evaluate({**device_environment(), "extra": e})
                                                  for e in wanted):
                continue
            needed = canonicalize_name(req.name)
            found = None if needed in carried else _version(needed)
            if needed not in carried and (found is None or not req.specifier.contains(found, prereleases=True)):
                unmet.append({"by": name, "needs": str(req), "found": found})
    return unmet


def preflight(site: Path) -> dict:
    import torch

    from ppdkit.models.device_plan import current_device_plan
    from ppdkit.trainer.autocast_probe import use_autocast

    plan = current_device_plan()
    return {"nvidia_smi": _checked(_nvidia_smi), "python": sys.version.split()[0],
            "torch_cuda": torch.version.cuda, "versions": {name: _version(name) for name in PACKAGES},
            "device_plan": dataclasses.asdict(plan), "unmet_in_the_image": _checked(lambda: _unmet_in_the_image(site)),
            "checks": {"nccl": _checked(lambda: torch.distributed.is_nccl_available()),
                       "ray_gpus": _checked(_ray_gpus),
                       "deepspeed_accelerator": _checked(lambda: _deepspeed_accelerator(plan)),
                       "eagle3_autocast": _checked(lambda: use_autocast("auto", torch.device(plan.device))),
                       "nf4_base": _checked(lambda: _nf4_base(cpu_inputs=False)),
                       "nf4_base_cpu_inputs": _checked(lambda: _nf4_base(cpu_inputs=True))}}


def collect(out: Path, run: Path, exit_code: int, started: float) -> dict:
    summaries = {p.parent.name: json.loads(p.read_text()) for p in sorted(run.glob("*/summary.json"))}
    log = out / "job.log"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    if log.is_file() and log.stat().st_size > MAX_BACK:
        log.write_text("\n".join(["[the head was cut to fit the device tool's 16 MiB]", *lines[-20000:]]))
    store = Path(os.environ.get("PPDKIT_CACHE", "")) / "mlflow" / "mlflow.db"
    if store.is_file() and store.stat().st_size <= MAX_BACK:
        shutil.copy(store, out / "mlflow.db")
    return {"exit_code": exit_code, "wall_seconds": round(time.time() - started, 1),
            "stage_seconds": {name: s.get("seconds") for name, s in summaries.items()}, "stages": summaries,
            "device_lines": [line for line in lines if DEVICE_LINE.search(line)][:200]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("preflight", "collect"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--site", type=Path, help="where the carried wheels were installed (preflight)")
    parser.add_argument("--run", type=Path, help="the job's output directory (collect)")
    parser.add_argument("--exit-code", type=int, default=None)
    parser.add_argument("--started", type=float, default=time.time(), help="when the device call began (epoch s)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report_path = args.out / "demo.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    if args.step == "preflight":
        report["preflight"] = preflight(args.site)
    else:
        report["job"] = collect(args.out, args.run, args.exit_code, args.started)
    report_path.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
