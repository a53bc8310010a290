"""`train.num_workers: 0`: Ray Train's local mode, the one rank in the driver's own process (no worker actors).

A fit on Ray Train workers has a fixed cost that dwarfs a small run: on 2 cores a 2-step run of the tiny model took
~20 s on two workers (actor starts, imports, gloo, the controller's polls) and ~1-2 s here. Ray's local mode runs the
function with no process group, and DeepSpeed needs one: the rank joins a gloo group of one, over an in-memory store
(a TCP store would listen on every interface) with gloo on loopback, and the process is put back as it was after the
run: its torch threads, environment, ppdkit log handlers and level, and DeepSpeed's cached world group.
"""

import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ppdkit.models.environment import environment

from .worker import train_loop_per_worker

# what a launcher sets for a rank, as torchrun and Ray Train's workers do (DeepSpeed's engine refuses to start without
# LOCAL_RANK); put back after the run
RANK_VARIABLES = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}


def loopback_interface() -> str:
    """The loopback interface's name, for gloo's device: `lo` on Linux (`lo0` elsewhere)."""
    return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), "lo")


@contextmanager
def group_of_one() -> Iterator[None]:
    """This process as a gloo process group of one rank, destroyed after; DeepSpeed's clone of the world group (made
    on first use and kept for the process) is dropped before and after, so each run clones its own group."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    if dist.is_initialized():
        raise RuntimeError("train.num_workers 0 trains in this process, which already belongs to a process group: "
                           "run it in its own process, or set train.num_workers to 1 or more")
    with environment(GLOO_SOCKET_IFNAME=loopback_interface(), **RANK_VARIABLES):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        groups._WORLD_GROUP = None
        try:
            yield
        finally:
            groups._WORLD_GROUP = None
            dist.destroy_process_group()


@contextmanager
def process_state_kept() -> Iterator[None]:
    """The torch threads, the environment and ppdkit's log handlers and level as they were before the block (the
    rank sets its own threads, its kernel caches' and DeepSpeed's variables, and a handler for its log file)."""
    threads, variables = torch.get_num_threads(), dict(os.environ)
    logger = logging.getLogger("ppdkit")
    handlers, level = list(logger.handlers), logger.level
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for name in set(os.environ) - set(variables):
            del os.environ[name]
        os.environ.update(variables)
        for handler in logger.handlers[:]:
            if handler not in handlers:
                logger.removeHandler(handler)
                handler.close()
        logger.setLevel(level)


def train_in_this_process(config: dict) -> None:
    """train_loop_per_worker as the only rank, in this process (Ray Train's local mode calls it)."""
    with process_state_kept(), group_of_one():
        train_loop_per_worker(config)
