"""Keeping a long-lived worker's memory flat (teacher actors, training ranks) while the shapes of its tensors
change with every sequence length.

Two things grow there, neither of them a live tensor (measured on the AMX Xeon, one eagle3 training process on the
large cache: about 15 MB a step, 5 GB after 160 steps, without leveling off; Ray's OOM killer stopped such runs
every ~600 steps):
- oneDNN's and ideep's caches of compiled kernels, one per shape met, up to 1024 each by default: capped here, the
  growth falls to about 4 MB a step at the same speed (the kernels of one step's shapes are reused within it);
- the freed memory that glibc's allocator keeps in its heaps, fragmented by tensors of ever new sizes:
  `release_freed_memory` every few steps hands it back (growth about 0.1 MB a step, under 2% slower at every
  tenth step). A lower mmap threshold would too, but made every step 1.7x slower.
"""

import ctypes
import ctypes.util
import functools
import os

KERNEL_CACHE_ENTRIES = 64  # compiled kernels kept per cache: a step's shapes, several times over


def bound_kernel_caches(entries: int = KERNEL_CACHE_ENTRIES) -> None:
    """Cap oneDNN's primitive cache and ideep's for this process. Call it before the process's first oneDNN
    operation: both read their variable once. A value already in the environment is kept."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(entries))
    os.environ.setdefault("LRU_CACHE_CAPACITY", str(entries))


def release_freed_memory() -> bool:
    """Return the allocator's free pages to the system (glibc's malloc_trim); False where the C library has none
    (musl, macOS)."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache  # find_library asks ldconfig, once is enough
def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None
