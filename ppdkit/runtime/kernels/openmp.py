"""Handing a thread's OpenMP workers back, so that the thread decoding is the only one whose workers wait for work.

torch's CPU operations and the native kernels run their parallel loops on GNU OpenMP, which keeps a team of worker
threads for every thread that has run one. Idle workers spin a while before they sleep, and the next parallel loop
finds them awake: a decoding step runs a few hundred short loops, so that wait is what keeps it fast. But once more
threads hold workers than the machine has cores (the thread that loaded the model, and a server's worker thread
that decodes), libgomp cuts every worker's spin to almost nothing, so each loop wakes its workers from sleep: on 2
cores the same decode ran at 110 tok/s in a worker thread against 340 on the thread that loaded the model (and the
loading thread's own decodes fell to 120 too, once another thread had decoded). A thread that is done with torch
work for a while therefore hands its workers back (OpenMP 5's omp_pause_resource_all): the loader once it has
loaded, `Decoder.generate` once its answer is complete, the serving engine whenever it has nothing to decode. The
next parallel loop on that thread makes a new team (tens of microseconds).
"""

import ctypes
import functools
import logging
import os

import torch

log = logging.getLogger(__name__)

_SOFT_PAUSE = 1  # omp_pause_soft: the threads go, the settings stay


@functools.cache
def _pause():
    """OpenMP's omp_pause_resource_all from the OpenMP library torch loaded, or None (no OpenMP, an older one)."""
    if not torch.backends.openmp.is_available():
        return None
    for name in ("libgomp.so.1", "libomp.so", "libiomp5.so"):  # already loaded by torch: found by its name
        try:
            return ctypes.CDLL(name, mode=os.RTLD_NOLOAD).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
    log.debug("no OpenMP library with omp_pause_resource_all is loaded: threads keep their OpenMP workers")
    return None


def release_openmp_threads() -> None:
    """Hand the calling thread's OpenMP workers back (nothing where torch runs without OpenMP). Call it on a thread
    that will not run torch work for a while; never inside a parallel region."""
    pause = _pause()
    if pause is not None:
        pause(_SOFT_PAUSE)
