"""ppdkit/data_pipeline/worker_memory.py: a worker's kernel caches are capped without overriding a user's setting, and the
allocator's freed pages really go back to the system."""

import os
import subprocess
import sys

from ppdkit.data_pipeline.worker_memory import KERNEL_CACHE_ENTRIES, bound_kernel_caches

# fragments glibc's heap as tensors of ever new sizes do: 3000 blocks of 60 KB (under the mmap threshold, so in the
# heap), every other one freed, the rest kept; prints the anonymous memory before and after releasing
FRAGMENTED_HEAP = """
import ctypes, ctypes.util
from ppdkit.data_pipeline.worker_memory import release_freed_memory
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def anon_kb():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("RssAnon"))
blocks = [libc.malloc(60_000) for _ in range(3000)]
for b in blocks:
    ctypes.memset(b, 1, 60_000)
for b in blocks[::2]:
    libc.free(b)
before = anon_kb()
released = release_freed_memory()
print(before, anon_kb(), released)
"""


def test_kernel_caches_are_capped_unless_set(monkeypatch):
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")  # a user's own choice stays
    bound_kernel_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(KERNEL_CACHE_ENTRIES)
    assert os.environ["LRU_CACHE_CAPACITY"] == "7"


def test_freed_heap_memory_goes_back_to_the_system():
    out = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, check=True)
    before, after, released = out.stdout.split()
    assert released == "True"
    # ~90 MB sit in freed 60 KB holes between live blocks, which no heap-top trim can reach
    assert int(before) - int(after) > 50_000, out.stdout
