"""Every device choice in one place (issue 57, item 4): ppdkit/models/device_plan.py's plan for a CPU and for a CUDA
GPU, made from the machine's facts passed in, so the GPU's choices are checked here without one; the call sites that
consult it (Ray Train's settings, DeepSpeed's accelerator, eagle3's autocast, the NF4 base's device map, the
regeneration engine); and what the demo job carries to a GPU machine (infra/gpu/demo_wheels.py): every package ppdkit
imports that the machine's image lacks, and the demo job's imports with nothing else importable."""

import ast
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import kernels_or_skip

import ppdkit
from ppdkit.models.config import BaseModelConfig
from ppdkit.models.device_plan import current_device_plan, device_plan
from ppdkit.trainer import autocast_probe, launch, worker

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / "infra" / "gpu"
CPU, GPU = device_plan(cuda_available=False), device_plan(True, device_count=2, bf16_supported=True, cuda_index=1)


class _Captured(Exception):
    """Raised by a stand-in once it has what a call site passed it: nothing heavier runs."""


def _demo_wheels():
    spec = importlib.util.spec_from_file_location("demo_wheels", GPU_DIR / "demo_wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_cpu_trains_with_gloo_on_deepspeeds_cpu_accelerator_and_regenerates_on_the_runtime():
    assert (CPU.device, CPU.cuda_index, CPU.ray_use_gpu, CPU.gpus_per_worker) == ("cpu", None, False, 0)
    assert (CPU.distributed_backend, CPU.deepspeed_accelerator, CPU.skip_shm_comm_build) == ("gloo", "cpu", True)
    assert (CPU.autocast, CPU.nf4_device_map, CPU.regeneration_engine) == ("timed", "cpu", "runtime")
    assert CPU.worker_resources(3) == {"CPU": 3}


def test_a_gpu_trains_with_nccl_on_its_own_gpu_and_regenerates_with_transformers_there():
    assert (GPU.device, GPU.cuda_index, GPU.ray_use_gpu, GPU.gpus_per_worker) == ("cuda", 1, True, 1)
    assert (GPU.distributed_backend, GPU.deepspeed_accelerator, GPU.skip_shm_comm_build) == ("nccl", "cuda", False)
    assert (GPU.autocast, GPU.nf4_device_map, GPU.regeneration_engine) == ("always", "cuda:1", "transformers")
    assert GPU.worker_resources(3) == {"CPU": 3, "GPU": 1}
    assert device_plan(True, 1, bf16_supported=False).autocast == "never"  # before Ampere: float32, not emulation
    with pytest.raises(ValueError, match="GPU 2 asked for, but torch sees 2"):
        device_plan(True, device_count=2, cuda_index=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the plan of a machine without a GPU")
def test_this_machine_plans_as_a_cpu_and_refuses_a_gpu_it_does_not_have():
    assert current_device_plan() == current_device_plan("cpu") == current_device_plan(torch.device("meta")) == CPU
    with pytest.raises(ValueError, match="torch sees no GPU"):
        current_device_plan("cuda:0")


def test_ray_train_gets_its_backend_gpus_and_resources_from_the_plan(monkeypatch, tmp_path):
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig

    assert launch.trainer_devices(CPU, 2) == {"torch_config": {"backend": "gloo"},  # what launch set before the plan
                                              "scaling_config": {"use_gpu": False, "resources_per_worker": {"CPU": 2}}}
    devices = launch.trainer_devices(GPU, 2)
    assert TorchConfig(**devices["torch_config"]).backend == "nccl"
    scaling = ScalingConfig(num_workers=1, **devices["scaling_config"])
    assert scaling.use_gpu and scaling.resources_per_worker == {"CPU": 2, "GPU": 1}

    seen = {}

    def trainer(train_loop, **kwargs):
        seen.update(kwargs)
        raise _Captured

    monkeypatch.setattr("ray.train.torch.TorchTrainer", trainer)
    monkeypatch.setattr(launch, "current_device_plan", lambda: GPU)
    from ppdkit.trainer.config import PromptTokenConfig

    with pytest.raises(_Captured):
        launch.run_training(BaseModelConfig(name="tiny-llama"), PromptTokenConfig(cpus_per_worker=2), tmp_path,
                            tmp_path / "out", None)
    assert seen["torch_config"].backend == "nccl"
    assert seen["scaling_config"].use_gpu and seen["scaling_config"].resources_per_worker == {"CPU": 2, "GPU": 1}


def test_deepspeed_gets_the_plans_accelerator_and_skips_the_shm_build_on_a_cpu_only(monkeypatch):
    comm = pytest.importorskip("deepspeed.comm.torch")
    build = comm.build_shm_op
    monkeypatch.setattr(comm, "build_shm_op", build)  # restored after the test
    monkeypatch.setenv("DS_ACCELERATOR", "recorded")  # so that the variable is put back as it was, set or not
    monkeypatch.delenv("DS_ACCELERATOR")
    monkeypatch.setattr(worker, "current_device_plan", lambda: GPU)
    worker._setup_deepspeed_accelerator()
    assert os.environ["DS_ACCELERATOR"] == "cuda" and comm.build_shm_op is build
    monkeypatch.delenv("DS_ACCELERATOR")
    monkeypatch.setattr(worker, "current_device_plan", lambda: CPU)
    worker._setup_deepspeed_accelerator()
    assert os.environ["DS_ACCELERATOR"] == "cpu" and comm.build_shm_op() is None


def test_eagle3_autocasts_on_a_bfloat16_gpu_without_timing_and_times_it_on_a_cpu(monkeypatch):
    timed = []
    monkeypatch.setattr(autocast_probe, "_autocast_is_faster", lambda: timed.append(1) or True)
    plans = {"cuda": GPU, "cpu": CPU}
    monkeypatch.setattr(autocast_probe, "current_device_plan", lambda device: plans[torch.device(device).type])
    assert autocast_probe.use_autocast("auto", torch.device("cuda", 1)) and not timed
    assert autocast_probe.use_autocast("auto", torch.device("cpu")) and timed == [1]
    monkeypatch.setattr(autocast_probe, "current_device_plan", lambda device: device_plan(True, 1, False))
    assert not autocast_probe.use_autocast("auto", torch.device("cuda", 0))
    assert autocast_probe.use_autocast("bf16-autocast", torch.device("cuda", 0))  # a precision named is kept


@pytest.mark.parametrize("plan", [CPU, GPU], ids=["cpu", "gpu"])
def test_the_nf4_base_loads_where_the_plan_says(monkeypatch, plan):
    pytest.importorskip("bitsandbytes")
    from ppdkit.models import loading

    seen = {}

    def from_pretrained(path, **kwargs):
        seen.update(kwargs)
        raise _Captured

    monkeypatch.setattr(loading, "current_device_plan", lambda: plan)
    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    with pytest.raises(_Captured):
        loading.load_base_model("tiny-llama", "nf4")
    assert seen["device_map"] == plan.nf4_device_map and seen["quantization_config"].bnb_4bit_quant_type == "nf4"


def test_a_teacher_on_the_gpu_regenerates_there_and_one_on_the_cpu_on_the_runtime(monkeypatch):
    kernels_or_skip("native")
    from ppdkit.data_pipeline import regenerate
    from ppdkit.models.loading import load_base_model

    on_gpu = SimpleNamespace(model=SimpleNamespace(parameters=lambda: iter([SimpleNamespace(device=torch.device("cuda",
                                                                                                            1))])))

    def no_cpu_copy(*args, **kwargs):
        raise AssertionError("a 4-bit teacher on the GPU loaded an unquantized copy for the CPU's runtime")

    monkeypatch.setattr(regenerate, "load_base_model", no_cpu_copy)
    nf4 = BaseModelConfig(name="tiny-llama", quantization="nf4")
    assert regenerate.regeneration_runtime(on_gpu, nf4, "float32", 64, GPU) is None
    on_cpu, unquantized = load_base_model("tiny-llama"), BaseModelConfig(name="tiny-llama", quantization="none")
    # an unquantized teacher nobody moved stays on the CPU's runtime, GPU or not (the teacher pass reads it too)
    assert regenerate.regeneration_runtime(on_cpu, unquantized, "float32", 64, GPU) is not None
    assert regenerate.regeneration_runtime(on_cpu, unquantized, "float32", 64, CPU) is not None


def test_a_training_batch_moves_whole_to_the_base_models_device():
    """Prompt-token training, evaluation and calibration move each collated batch to the base model's device; the
    meta device stands for a GPU here: every tensor of the batch goes, its layout stays."""
    import random

    from ppdkit.data_pipeline.teacher_cache import ShardSequence
    from ppdkit.trainer.prompt_batch import collate

    seq = ShardSequence(row=0, input_ids=torch.arange(12), positions=torch.arange(4, 11),
                        topk_ids=torch.zeros(7, 4, dtype=torch.long), topk_logprobs=torch.zeros(7, 4),
                        rest_mass=torch.zeros(7), features=None)
    batch = collate([seq], 3, 1, 2, "ensemble", random.Random(0))
    moved = batch.to(torch.device("meta"))
    tensors = [name for name, value in vars(batch).items() if isinstance(value, torch.Tensor)]
    assert len(tensors) == 11 and all(getattr(moved, name).device.type == "meta" for name in tensors)
    assert moved.ordinary_len == batch.ordinary_len and batch.input_ids.device.type == "cpu"


def test_the_wheel_closure_follows_extras_and_markers_and_stops_at_the_image():
    demo = _demo_wheels()
    requires = {"app": ["lib>=1", "extra-only; extra == 'web'", "old-python; python_version < '3.12'", "torch"],
                "lib": ["app"], "extra-only": [], "torch": ["never-read"]}
    installed = {"app": "2.0", "lib": "1.5"}.get
    closure = demo.wheel_closure(("app[web]",), requires.__getitem__, installed, frozenset({"torch"}),
                                 demo.device_environment())
    assert closure == {"app": "app==2.0", "extra-only": "extra-only", "lib": "lib==1.5"}


def _third_party_imports() -> dict[str, set[str]]:
    """{top-level module: ppdkit files importing it} for every module outside the standard library and ppdkit."""
    found: dict[str, set[str]] = {}
    for path in Path(ppdkit.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "ppdkit":
                    found.setdefault(top, set()).add(path.name)
    return found


# imported by ppdkit, never by the demo job: the layer-skip search's sampler, the bench's llama.cpp baselines
NOT_IN_THE_DEMO = {"optuna", "llama_cpp"}


def test_the_demo_carries_every_package_ppdkit_imports_that_the_image_lacks():
    from importlib.metadata import packages_distributions

    from packaging.utils import canonicalize_name

    demo = _demo_wheels()
    owners = packages_distributions()  # module -> the distributions holding it (mlflow: the full one and skinny)
    there = demo.image_packages() | set(demo.demo_wheels())
    missing = {module for module in _third_party_imports()
               if not any(canonicalize_name(d) in there for d in owners.get(module, [module]))}
    assert missing == NOT_IN_THE_DEMO
    assert {"ray", "deepspeed", "mlflow-skinny", "bitsandbytes", "pydantic", "gguf", "datasets"} <= set(
        demo.demo_wheels())


# Only the image's packages and the carried ones import; any other fails as absent, as on the GPU machine. The
# image's packages are this venv's versions, so what they need here counts as theirs.
IMAGE_ONLY = """
import importlib.metadata, os, re, sys
def _canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()
_ALLOWED = {_canonical(n) for n in os.environ["PPDKIT_DEVICE_PACKAGES"].split(",")}
for module, owners in importlib.metadata.packages_distributions().items():
    if not any(_canonical(owner) in _ALLOWED for owner in owners):
        sys.modules[module] = None  # importing it fails, and find_spec answers None: not installed
"""
DEMO_MODULES = ("ppdkit.cli.main", "ppdkit.jobs.pipeline", "ppdkit.data_pipeline.data_stage",
                "ppdkit.data_pipeline.teacher_stage", "ppdkit.trainer.launch", "ppdkit.trainer.worker",
                "ppdkit.trainer.calibrate", "ppdkit.trainer.evaluate", "ppdkit.registry.tracking",
                "ppdkit.registry.models", "ppdkit.registry.pyfunc", "ppdkit.runtime.decoder", "ppdkit.bench.decoding",
                "ray.train.torch", "ray.dashboard", "deepspeed", "mlflow", "bitsandbytes", "datasets", "gguf")


@pytest.mark.slow
def test_the_demo_jobs_modules_import_with_the_image_and_the_carried_wheels_alone(tmp_path):
    demo = _demo_wheels()
    image = demo.image_packages()
    stand_ins = demo.wheel_closure(tuple(sorted(image)), lambda n: demo._requires(n) if demo._installed(n) else [],
                                   demo._installed, frozenset(), demo.device_environment())
    (tmp_path / "sitecustomize.py").write_text(IMAGE_ONLY)
    allowed = ",".join(["ppdkit", *image, *stand_ins, *demo.demo_wheels()])
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PPDKIT_DEVICE_PACKAGES": allowed}
    check = f"import importlib\nfor m in {DEMO_MODULES!r}:\n    importlib.import_module(m)\nimport optuna"
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=300)
    assert "import of optuna halted" in done.stderr, done.stderr[-3000:]  # the last import: all before it came


def test_the_device_scripts_parse():
    for script in sorted(GPU_DIR.glob("*.sh")):
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, f"{script.name}: {done.stderr}"


def test_parts_stashed_over_several_calls_unpack_into_the_payload_and_a_part_never_stashed_is_named(tmp_path):
    repo, stash = tmp_path / "repo", tmp_path / "stash"
    (repo / "infra" / "gpu").mkdir(parents=True)
    shutil.copy(GPU_DIR / "demo-job.sh", repo / "infra" / "gpu")
    (tmp_path / "payload" / "site" / "carried").mkdir(parents=True)
    (tmp_path / "payload" / "site" / "carried" / "__init__.py").write_text("WHEEL = 1\n")
    with tarfile.open(tmp_path / "payload.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "payload", arcname=".")
    archive = (tmp_path / "payload.tar.xz").read_bytes()
    manifest = f"{hashlib.sha256(archive).hexdigest()}\npart-00\npart-01\n"

    def call(step: str, carried: dict[str, bytes | str]) -> subprocess.CompletedProcess:
        """One device call: the tree holds what this call carries alone; the stash outlives it."""
        shutil.rmtree(repo / ".gpu-lane", ignore_errors=True)
        (repo / ".gpu-lane" / "demo").mkdir(parents=True)
        for name, data in carried.items():
            path = repo / ".gpu-lane" / "demo" / name
            path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
        return subprocess.run(["bash", str(repo / "infra" / "gpu" / "demo-job.sh"), step], capture_output=True,
                              text=True, env={**os.environ, "DEMO_STASH": str(stash)})

    assert call("stash", {"part-00": archive[:100]}).returncode == 0
    assert call("stash", {"manifest.txt": manifest}).returncode == 0  # as if part-01's call never came
    lost = call("unpack", {})
    assert lost.returncode == 3 and "parts never stashed" in lost.stderr and "part-01" in lost.stderr
    assert call("stash", {"part-01": archive[100:]}).returncode == 0
    done = call("unpack", {})
    assert done.returncode == 0, done.stderr
    assert (stash / "payload" / "site" / "carried" / "__init__.py").read_text() == "WHEEL = 1\n"
