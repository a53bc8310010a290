"""Ray for a pipeline run: connect to a cluster when one is named, else start an embedded local Ray."""

import logging
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from ppdkit.models.environment import environment

from .spec import RayConfig

log = logging.getLogger(__name__)


def keep_local_ray_on_loopback() -> None:
    """Ray reads these when it is imported: call before the first `import ray` of the process.

    With RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 an embedded Ray binds its GCS, raylet and workers to
    127.0.0.1 instead of every interface; nothing outside this machine should reach it.
    """
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


# Ray Train's controller polls its workers every 2 s and its preemption watcher every 5 s, and a run waits out both
# as it ends: measured on 2 cores, a 2-step run took 32 s at those intervals and 20 s at these. The polls are a
# remote call per worker each: nothing beside a training step.
QUICK_TRAIN_POLLS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5"}


def quick_train_polls() -> None:
    """Before a Ray instance starts (its raylet's workers inherit the environment): unless set already."""
    for name, value in QUICK_TRAIN_POLLS.items():
        os.environ.setdefault(name, value)


@contextmanager
def lazy_ray_session(cfg: RayConfig, log_to_driver: bool = True) -> Iterator[Callable[[], None]]:
    """Yields `start()`, which opens `ray_session(cfg)` on its first call; closed on exit if opened.
    `log_to_driver` False keeps the workers' output off this terminal (Ray's log files and dashboard keep it).

    A rerun that only has stages left that do not use Ray (calibrate, evaluate, register) then starts
    none: seconds saved, and nothing started beside what a killed run may have left running.
    """
    with ExitStack() as stack:
        opened: list[bool] = []

        def start() -> None:
            if not opened:
                stack.enter_context(ray_session(cfg, log_to_driver))
                opened.append(True)

        yield start


@contextmanager
def ray_session(cfg: RayConfig, log_to_driver: bool = True) -> Iterator[None]:
    keep_local_ray_on_loopback()
    import ray

    if ray.is_initialized():  # inside a Ray job, or a caller that set Ray up itself: theirs to stop
        yield
        return
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if not address:
        with local_ray(cfg.num_cpus, cfg.object_store_mb, log_to_driver):
            log.info("Ray: embedded local instance with %s CPUs, dashboard %s", ray.cluster_resources().get("CPU"),
                     os.environ[API_SERVER_VARIABLE])
            yield
        return
    log.info("Ray: connecting to %s", address)
    try:
        ray.init(address=address, log_to_driver=log_to_driver)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ConnectionError(
            f"cannot reach a Ray cluster at {address!r} ({e}); start one (`ray start --head`) or drop "
            "ray.address to run on an embedded local Ray"
        ) from None
    try:
        yield
    finally:
        ray.shutdown()


API_SERVER_VARIABLE = "RAY_API_SERVER_ADDRESS"


@contextmanager
def local_ray(num_cpus: int | None, object_store_mb: int, log_to_driver: bool = True) -> Iterator[None]:
    """A new Ray instance for this process on 127.0.0.1 (address="local": never a `ray start` cluster
    or its stale address), with its own dashboard on a free port; shut down on exit.

    Ray's state API finds its cluster by auto-detection unless told. Ray Train's placement-group
    cleaner polls it to see whether a run's controller still lives; with another Ray on the machine it
    asks that one, does not find the controller, and removes the running job's placement group: the
    training dies. RAY_API_SERVER_ADDRESS, inherited by every process of the new instance, pins the
    state API to this instance's own dashboard.
    """
    keep_local_ray_on_loopback()
    quick_train_polls()
    import ray

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Ray's "Started a local Ray instance" line is INFO of its own logger, shown with --verbose (log_to_driver):
    # ppdkit prints the dashboard address itself
    with environment(**{API_SERVER_VARIABLE: f"http://127.0.0.1:{port}"}):
        try:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=True, dashboard_host="127.0.0.1",
                     dashboard_port=port, _node_ip_address="127.0.0.1", object_store_memory=object_store_mb * 2**20,
                     log_to_driver=log_to_driver, logging_level=logging.INFO if log_to_driver else logging.WARNING)
            yield
        finally:
            ray.shutdown()  # before the variable is put back: Ray's processes read it until they stop
