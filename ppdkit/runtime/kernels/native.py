"""The runtime's native kernels (runtime/kernels/*.cpp), built for this CPU on first use and cached.

Built with -march=native by PyTorch's extension builder into its usual directory (TORCH_EXTENSIONS_DIR,
by default ~/.cache/torch_extensions), named by the sources, the PyTorch install and the CPU, so a machine
builds them once (about a minute) whatever ppdkit cache a process uses. The build compiles copies of the sources
kept in that directory, with the ninja of ppdkit's own environment where it has one: ninja rebuilds everything
when its build file names other source paths (a job's copy of the package on a Ray cluster) or when another
ninja version wrote its logs (a system ninja and the venv's, found by PATH), which cost 1.5 minutes a switch.
Anything that stops the build (no compiler, neither AVX-512 nor AVX2, PPDKIT_NATIVE_KERNELS=0) leaves the runtime on
its portable path, with one warning saying why. PPDKIT_NATIVE_CFLAGS adds compiler flags to the build (a build of
its own): "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" leaves AMX out, to time what a CPU without it would do.
"""

import functools
import hashlib
import logging
import os
import platform
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch

from ppdkit.models.environment import environment

log = logging.getLogger(__name__)
KERNELS = Path(__file__).parent  # the C++ sources sit beside this file


def cpu_info(path: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first CPU's fields of /proc/cpuinfo (`model name`, `flags`, ...); {} where there is none (not Linux)."""
    fields: dict[str, str] = {}
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _cpu_flags() -> str:
    return cpu_info().get("flags") or platform.processor()


def cpu_supports_kernels() -> bool:
    """AVX-512, or AVX2 with FMA: the vector units runtime/kernels/ is written for."""
    flags = set(_cpu_flags().split())
    return "avx512f" in flags or {"avx2", "fma"} <= flags


@functools.cache
def native_kernels() -> ModuleType | None:
    """runtime/kernels/ built as one module for this CPU (the few-rows matmul, the decoder layers), or
    None where it cannot run."""
    if os.environ.get("PPDKIT_NATIVE_KERNELS", "1") == "0":
        return None
    if not cpu_supports_kernels():
        log.info("neither AVX-512 nor AVX2 on this CPU: the runtime's matmuls use oneDNN")
        return None
    return build_kernels(requested_cflags())


def requested_cflags() -> tuple[str, ...]:
    """The compiler flags PPDKIT_NATIVE_CFLAGS adds to the runtime's build (shell words), e.g. `-mno-amx-tile`."""
    return tuple(shlex.split(os.environ.get("PPDKIT_NATIVE_CFLAGS", "")))


def _kernel_files() -> list[Path]:
    """runtime/kernels/'s sources and headers: what names a build and what it compiles."""
    return sorted(KERNELS.glob("*.[ch]*"))


def _flags(extra_cflags: tuple[str, ...]) -> list[str]:
    return ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", *extra_cflags]


def kernels_build_dir(extra_cflags: tuple[str, ...] = ()) -> Path:
    """The folder build_kernels(extra_cflags) builds in: named by the sources, the flags, this CPU and the PyTorch
    install (another venv's headers and libraries are another build)."""
    from torch.utils.cpp_extension import get_default_build_root

    code = b"".join(path.read_bytes() for path in _kernel_files())
    stamp = (code + torch.__version__.encode() + torch.__file__.encode() + _cpu_flags().encode()
             + " ".join(_flags(extra_cflags)).encode())
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / f"ppdkit_kernels_{hashlib.sha256(stamp).hexdigest()[:12]}"


@functools.cache
def build_kernels(extra_cflags: tuple[str, ...] = ()) -> ModuleType | None:
    """Build (or load the cached build of) runtime/kernels/ with -march=native plus `extra_cflags`
    (("-mno-avx512f",) builds the AVX2 variant on an AVX-512 machine, as the tests do)."""
    try:
        from torch.utils.cpp_extension import load

        build = kernels_build_dir(extra_cflags)
        build.mkdir(parents=True, exist_ok=True)
        if not any(build.glob("*.so")):
            log.info("building the runtime's native kernels for this CPU in %s (once, about a minute)", build)
        sources = _copied_sources(_kernel_files(), build / "src")
        with _own_ninja_first():
            module = load(name=build.name, sources=[str(path) for path in sources if path.suffix == ".cpp"],
                          build_directory=str(build), extra_include_paths=[str(build / "src")],
                          extra_cflags=_flags(extra_cflags), extra_ldflags=["-fopenmp"],
                          verbose=False)  # OpenMP: at::parallel_for runs on PyTorch's threads. No contraction of
            # a * b + c into an FMA behind our back: a loop's vector body and scalar tail must round alike
    except Exception as error:  # a missing compiler or ninja must not stop decoding
        log.warning("the runtime's native kernels could not be built (%s); using oneDNN, which is slower "
                    "for decoding steps. Install a C++ compiler, or set PPDKIT_NATIVE_KERNELS=0 to skip", error)
        return None
    return module if module.available() else None


def _copied_sources(files: list[Path], folder: Path) -> list[Path]:
    """`files` copied into `folder` once (the build directory is named by their content, so a copy there never
    goes stale): the build file then names the same paths wherever the package lives. Written under a temporary
    name and renamed, so processes building at once never read half a file; an existing copy keeps its mtime,
    which ninja compares with the objects'."""
    folder.mkdir(parents=True, exist_ok=True)
    copies = []
    for path in files:
        copy = folder / path.name
        if not copy.exists():
            partial = folder / f".{path.name}.{os.getpid()}"
            partial.write_bytes(path.read_bytes())
            partial.replace(copy)
        copies.append(copy)
    return copies


@contextmanager
def _own_ninja_first():
    """PATH with this Python's own scripts folder first while torch builds, where ninja is installed there (a
    dependency of ppdkit): every process of the venv then runs one ninja, activated or not."""
    scripts, saved = Path(sys.executable).parent, os.environ.get("PATH")
    if not (scripts / "ninja").exists():
        yield
        return
    with environment(PATH=os.pathsep.join([str(scripts), *([saved] if saved else [])])):
        yield


BF16_KERNELS = ("auto", "amx", "avx512", "avx2")


def bf16_kernel(native: ModuleType) -> str:
    """The native kernel bfloat16 weights are packed for in this process: AMX tiles where the CPU has them
    (a tile multiplies many rows at once, so a tree's rows cost little more than one, where AVX512-BF16's dot
    products grow with every row; docs/history.md), else the build's vector panels: avx512 (VDPBF16PS where the CPU
    has AVX512-BF16, float32 FMAs on the same bits otherwise) or avx2 (float32 FMAs, 8-column panels).
    PPDKIT_BF16_KERNEL=amx|avx512|avx2 picks one (the tests run each this CPU has). Every weight of a process takes
    the same: AMX rounds otherwise inside a sum, and a decoder's rows must all come from one kernel."""
    requested = os.environ.get("PPDKIT_BF16_KERNEL", "auto")
    if requested not in BF16_KERNELS:
        raise ValueError(f"PPDKIT_BF16_KERNEL must be one of {', '.join(BF16_KERNELS)}, not {requested!r}")
    if requested == "amx" and not native.amx_available():
        raise ValueError("PPDKIT_BF16_KERNEL=amx, but this CPU or build has no AMX-BF16 tiles (no amx_bf16 in "
                         "/proc/cpuinfo, or Linux refused them): unset it to use the vector kernel")
    vector = native.vector_kernel()
    if requested in ("avx512", "avx2") and requested != vector:
        raise ValueError(f"PPDKIT_BF16_KERNEL={requested}, but the native kernels are built for {vector} on this "
                         f"CPU: unset it, or set it to {vector}")
    if requested == "auto":
        return "amx" if native.amx_available() else vector
    return requested


@functools.cache
def tune_bf16_fma(native: ModuleType) -> int:
    """Set `native`'s AVX512-BF16 path to run on FMAs from bf16_fma_rows' count, once per module: called where the
    first weight is packed for that path (runtime/forward/linear.Linear), so a process that never multiplies on it never
    times it. -> the count (1 where the CPU has no VDPBF16PS: the FMAs are its only way)."""
    if not native.bf16_dot_available():
        return 1
    rows = bf16_fma_rows(native)
    native.bf16_fma_from_rows(rows)
    return rows


NEVER = 2 ** 62  # a row count no call reaches: the AVX512-BF16 path keeps VDPBF16PS for every call
FMA_ROWS_TRIED = (2, 3, 4, 6, 8, 12)


def bf16_fma_rows(native: ModuleType) -> int:
    """From how many rows the AVX512-BF16 few-rows matmul runs on float32 FMAs instead of VDPBF16PS: the same bits
    either way (runtime/kernels/skinny_linear.cpp), so only speed decides. PPDKIT_BF16_FMA_ROWS=N (or `never`) sets
    it; else both are timed here once per process on a 3072 x 576 weight (a few milliseconds), and the FMAs take
    over from the fewest rows where they are faster at that count and at every larger one tried. Timed, not fixed:
    how fast VDPBF16PS runs against FMAs is the CPU's own (on some cores far slower, docs/history.md), and where it
    is as fast it stays."""
    requested = os.environ.get("PPDKIT_BF16_FMA_ROWS", "")
    if requested:
        if requested == "never":
            return NEVER
        if not requested.isdigit() or int(requested) < 1:
            raise ValueError(f"PPDKIT_BF16_FMA_ROWS must be a number of rows (1 or more) or never, not {requested!r}")
        return int(requested)
    generator, saved = torch.Generator().manual_seed(0), native.bf16_fma_from_rows()
    panels = native.pack(torch.randn(3072, 576, generator=generator).bfloat16(), "avx512")

    def fastest(rows: int, threshold: int) -> float:
        native.bf16_fma_from_rows(threshold)
        x = torch.randn(rows, 576, generator=generator)
        native.linear(x, panels, 3072)  # warm
        times = []
        for _ in range(7):
            start = time.perf_counter()
            native.linear(x, panels, 3072)
            times.append(time.perf_counter() - start)
        return min(times)

    gains = {rows: fastest(rows, NEVER) / fastest(rows, rows) for rows in FMA_ROWS_TRIED}
    native.bf16_fma_from_rows(saved)
    threshold = NEVER
    for rows in reversed(FMA_ROWS_TRIED):  # the fewest rows from which the FMAs win at every count tried
        if gains[rows] < 1.05:
            break
        threshold = rows
    log.info("bfloat16 few-rows matmul: %s (VDPBF16PS / FMA time by rows: %s)",
             f"float32 FMAs from {threshold} rows" if threshold < NEVER else "VDPBF16PS for every row count",
             ", ".join(f"{rows}: {gain:.2f}" for rows, gain in gains.items()))
    return threshold
