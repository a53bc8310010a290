"""Keeping a long-lived worker's memory flat (teacher actors, training ranks) while the shapes of its tensors
change with every sequence length.

Two things grow there without leveling off, neither of them a live tensor, until an OOM killer stops the worker
(what was measured: docs/history.md):
- oneDNN's and ideep's caches of compiled kernels, one per shape met, up to 1024 each by default: capped here at no
  cost in speed (the kernels of one step's shapes are reused within it);
- the freed memory that glibc's allocator keeps in its heaps, fragmented by tensors of ever new sizes:
  `release_freed_memory` every few steps hands it back, at little cost. A lower mmap threshold would too, but every
  step would pay for fresh pages.
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
