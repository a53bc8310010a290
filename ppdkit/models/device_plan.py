"""Every device choice of the training service, made in one place from what the machine has.

On a CPU: Ray Train workers without a GPU, gloo, DeepSpeed's CPU accelerator (without its shared-memory allreduce op,
whose first build costs 35 s), bfloat16 autocast only where this CPU runs it faster (trainer/autocast_probe.py times
it), the NF4 teacher on the CPU, and regeneration on the decoder's own runtime (continuous batching on its native
kernels, the numbers `ppdkit decode` verifies with). On a CUDA GPU: one GPU per Ray Train worker, nccl, DeepSpeed's
CUDA accelerator, bfloat16 autocast always (where the GPU has bfloat16), the NF4 teacher on this process's GPU through
bitsandbytes, and regeneration through transformers' generate in batches on that GPU (the runtime's native kernels
are CPU code).

`device_plan` decides from the machine's facts, passed in, so the GPU's choices are tested on a CPU;
`current_device_plan` reads them from torch.
"""

from dataclasses import dataclass
from typing import Literal

import torch

Device = Literal["cuda", "cpu"]


@dataclass(frozen=True)
class DevicePlan:
    device: Device  # where this process computes: the teacher's forward, training, regeneration
    cuda_index: int | None  # this process's GPU (Ray Train sets each worker's current device); None on a CPU
    ray_use_gpu: bool  # Ray Train's ScalingConfig(use_gpu=...)
    gpus_per_worker: int  # GPUs each Ray Train worker asks for: one rank, one GPU
    distributed_backend: Literal["nccl", "gloo"]  # torch.distributed, through Ray Train's TorchConfig
    deepspeed_accelerator: Device  # DS_ACCELERATOR: set, DeepSpeed neither guesses nor prints its banner
    skip_shm_comm_build: bool  # the CPU accelerator's shared-memory allreduce: only its JIT build would cost
    autocast: Literal["always", "timed", "never"]  # eagle3's train.precision auto: bfloat16 autocast or float32
    nf4_device_map: str  # transformers' device_map for a 4-bit base: bitsandbytes quantizes where it loads
    regeneration_engine: Literal["runtime", "transformers"]  # what writes the teacher's regenerated turns

    def worker_resources(self, cpus: int) -> dict[str, int]:
        """Ray Train's resources_per_worker: `cpus` CPUs, and the worker's GPU where there is one."""
        return {"CPU": cpus, **({"GPU": self.gpus_per_worker} if self.gpus_per_worker else {})}


def device_plan(cuda_available: bool, device_count: int = 0, bf16_supported: bool = False,
                cuda_index: int = 0) -> DevicePlan:
    """The plan for a machine where torch sees `device_count` CUDA GPUs (none: a CPU) and this process uses GPU
    `cuda_index`; `bf16_supported`: that GPU computes in bfloat16 (Ampere and later)."""
    if not cuda_available:
        return DevicePlan(device="cpu", cuda_index=None, ray_use_gpu=False, gpus_per_worker=0,
                          distributed_backend="gloo", deepspeed_accelerator="cpu", skip_shm_comm_build=True,
                          autocast="timed", nf4_device_map="cpu", regeneration_engine="runtime")
    if not 0 <= cuda_index < device_count:
        raise ValueError(f"GPU {cuda_index} asked for, but torch sees {device_count} GPU(s)")
    # One whole GPU per process: the 4-bit base of SmolLM2-size models fits many times over, and "auto" would
    # spread it over every GPU a teacher actor sees (Ray hides none from actors that ask for no GPU).
    return DevicePlan(device="cuda", cuda_index=cuda_index, ray_use_gpu=True, gpus_per_worker=1,
                      distributed_backend="nccl", deepspeed_accelerator="cuda", skip_shm_comm_build=False,
                      autocast="always" if bf16_supported else "never", nf4_device_map=f"cuda:{cuda_index}",
                      regeneration_engine="transformers")


def current_device_plan(device: str | torch.device | None = None) -> DevicePlan:
    """This process's plan: on `device` where one is named ("cpu" keeps a GPU machine's work on its CPU; "cuda" or
    "cuda:N" needs a GPU torch sees; any other device, such as meta in tests, plans as a CPU), else on the GPU
    torch sees, if any."""
    kind = torch.device(device).type if device is not None else "cuda" if torch.cuda.is_available() else "cpu"
    if kind != "cuda":
        return device_plan(cuda_available=False)
    if not torch.cuda.is_available():
        raise ValueError(f"device {device} asked for, but torch sees no GPU (torch {torch.__version__})")
    index = torch.device(device).index if device is not None else None
    index = torch.cuda.current_device() if index is None else index
    # bfloat16 natively from Ampere (compute capability 8.0) on: torch's is_bf16_supported also counts emulation
    return device_plan(True, torch.cuda.device_count(), torch.cuda.get_device_capability(index) >= (8, 0), index)
