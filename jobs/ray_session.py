"""Ray for a pipeline run: connect to a cluster when one is named, else start an embedded local Ray."""

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from .spec import RayConfig

log = logging.getLogger(__name__)


def keep_local_ray_on_loopback() -> None:
    """Ray reads these when it is imported: call before the first `import ray` of the process.

    With RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 an embedded Ray binds its GCS, raylet and workers to
    127.0.0.1 instead of every interface; nothing outside this machine should reach it.
    """
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@contextmanager
def ray_session(cfg: RayConfig) -> Iterator[None]:
    keep_local_ray_on_loopback()
    import ray

    if ray.is_initialized():  # inside a Ray job, or a caller that set Ray up itself: theirs to stop
        yield
        return
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        log.info("Ray: connecting to %s", address)
        try:
            ray.init(address=address, log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise ConnectionError(
                f"cannot reach a Ray cluster at {address!r} ({e}); start one (`ray start --head`) or drop "
                "ray.address to run on an embedded local Ray"
            ) from None
    else:
        # address="local": a new instance, even when `ray start` left a cluster (or its stale address) here
        ray.init(address="local", num_cpus=cfg.num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
                 object_store_memory=cfg.object_store_mb * 2**20, log_to_driver=True)
        log.info("Ray: embedded local instance with %s CPUs", ray.cluster_resources().get("CPU"))
    try:
        yield
    finally:
        ray.shutdown()
