"""Device helpers: a checked torch device, a context that makes tensors built without a device land on the
decoder's, and one that sets torch's CPU threads for a while."""

import contextlib

import torch


def check_device(device: str | torch.device) -> torch.device:
    """A torch device this machine has, or a clear error naming what it does have."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{device!r} is not a torch device ({e}); use cpu, cuda, cuda:N or mps") from None
    present = {"cpu": True, "meta": True, "cuda": torch.cuda.is_available(),
               "mps": hasattr(torch.backends, "mps") and torch.backends.mps.is_available()}
    if not present.get(device.type, False):
        raise ValueError(f"torch sees no {device.type} device on this machine (this torch build: {torch.__version__}); "
                         "use --device cpu, or install a torch build for that device")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{device} does not exist: torch sees {torch.cuda.device_count()} cuda device(s)")
    return device


def on_device(device: torch.device):
    """A context in which tensors made without a device land on `device` (the layouts and per-step inputs the
    decoding loops build), or nothing where that is the default already: the context intercepts every torch
    call, an overhead a CPU decoding step need not pay."""
    return contextlib.nullcontext() if torch.get_default_device() == device else torch.device(device)


@contextlib.contextmanager
def torch_threads(count: int | None):
    """torch's CPU threads set to `count` inside (None: left alone) and the caller's count restored after: a benchmark
    called as a library function (or by the tests) must not leave its process on one thread."""
    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
