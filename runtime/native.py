"""The runtime's native kernels (runtime/kernels/*.cpp), built for this CPU on first use and cached.

Built with -march=native by PyTorch's extension builder into its usual directory (TORCH_EXTENSIONS_DIR,
by default ~/.cache/torch_extensions), named by the sources, the PyTorch version and the CPU, so a machine
builds them once (about a minute) whatever ppdkit cache a process uses. Anything that stops the
build (no compiler, no AVX-512, PPDKIT_NATIVE_KERNELS=0) leaves the runtime on its portable path, with
one warning saying why.
"""

import functools
import hashlib
import logging
import os
import platform
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)
KERNELS = Path(__file__).parent / "kernels"


def _cpu_flags() -> str:
    try:
        return next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return platform.processor()


def cpu_has_avx512() -> bool:
    return " avx512f" in _cpu_flags()


@functools.cache
def native_kernels() -> ModuleType | None:
    """runtime/kernels/ built as one module (the few-rows matmul, the decoder layers), or None where it
    cannot run."""
    if os.environ.get("PPDKIT_NATIVE_KERNELS", "1") == "0":
        return None
    if not cpu_has_avx512():
        log.info("no AVX-512 on this CPU: the runtime's matmuls use oneDNN")
        return None
    sources = sorted(KERNELS.glob("*.cpp"))
    code = b"".join(path.read_bytes() for path in sorted(KERNELS.glob("*.[ch]*")))
    key = hashlib.sha256(code + torch.__version__.encode() + _cpu_flags().encode()).hexdigest()[:12]
    name = f"ppdkit_kernels_{key}"
    try:
        from torch.utils.cpp_extension import get_default_build_root, load

        build = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / name
        build.mkdir(parents=True, exist_ok=True)
        if not any(build.glob("*.so")):
            log.info("building the runtime's native kernels for this CPU in %s (once, about a minute)", build)
        module = load(name=name, sources=[str(path) for path in sources], build_directory=str(build),
                      extra_include_paths=[str(KERNELS)],
                      extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                      verbose=False)  # OpenMP: at::parallel_for runs on PyTorch's threads
    except Exception as error:  # a missing compiler or ninja must not stop decoding
        log.warning("the runtime's native kernels could not be built (%s); using oneDNN, which is slower "
                    "for decoding steps. Install a C++ compiler, or set PPDKIT_NATIVE_KERNELS=0 to skip", error)
        return None
    return module if module.available() else None
