"""`ray start --address ...` for a second node on the head's machine, with every process of it on 127.0.0.1.

Ray's CLI refuses a worker node unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is 1, and with it set to 1 it replaces
127.0.0.1 (in --address and --node-ip-address alike) by the machine's network address, and the node's raylet, agent
and metrics exporter listen on every interface. With 0, which ppdkit's heads use, every address stays 127.0.0.1 and
every process binds there: this lifts only the CLI's refusal (its own view of the setting), nothing else of Ray's.
Run by add-local-worker.sh with `ray start`'s own arguments.
"""

import sys
import types

import ray._private.ray_constants as constants
from ray.scripts import scripts


class _WorkerNodeAllowed(types.ModuleType):
    ENABLE_RAY_CLUSTER = True

    def __getattr__(self, name: str):
        return getattr(constants, name)


scripts.ray_constants = _WorkerNodeAllowed(constants.__name__)
sys.exit(scripts.main())
