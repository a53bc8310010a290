"""A Ray cluster of several nodes on this machine, driven through this folder's scripts: a head
(start-local-head.sh), worker nodes (add-local-worker.sh), a node lost as a machine is lost (its raylet killed), and
everything stopped. For the tests of two nodes and the throughput measurement of docs/clusters.md; not imported by
the ppdkit package.

    with LocalCluster(state_dir, head_cpus=2) as cluster:
        cluster.add_worker("w1", cpus=1)
        ... `ppdkit submit ... --address cluster.dashboard` or ray.address=cluster.address ...
        cluster.lose("w1")
"""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
AGENT_PORTS = ("RAY_AGENT_PORT", "RAY_AGENT_GRPC_PORT", "RAY_RUNTIME_ENV_AGENT_PORT", "RAY_METRICS_PORT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """The head takes free ports of its own (another Ray on the machine, an embedded one, holds Ray's defaults), and
    keeps its state under `state_dir` (the scripts' $PPDKIT_CACHE)."""

    def __init__(self, state_dir: Path, head_cpus: int, env: dict[str, str] | None = None):
        self.head_cpus, self.workers = head_cpus, []
        gcs, dashboard = free_port(), free_port()
        self.env = {**(env or os.environ), "PPDKIT_CACHE": str(state_dir), "RAY_GCS_PORT": str(gcs),
                    "RAY_DASHBOARD_PORT": str(dashboard), "RAY_AUTH_MODE": "disabled",
                    **{name: str(free_port()) for name in AGENT_PORTS}}
        self.env.pop("RAY_ADDRESS", None)
        # a node stopped with work left (a job's supervisor, say) drains for up to 30 s first: these clusters are
        # stopped when their work is done or lost
        self.env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "3")
        self.address = f"127.0.0.1:{gcs}"  # for ray.address / ray.init
        self.dashboard = f"http://127.0.0.1:{dashboard}"  # the job API, for `ppdkit submit --address`
        self.state_dir = state_dir

    def __enter__(self) -> "LocalCluster":
        self._script("start-local-head.sh", str(self.head_cpus))
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def add_worker(self, name: str, cpus: int) -> None:
        self._script("add-local-worker.sh", name, str(cpus))
        self.workers.append(name)

    def worker_pid(self, name: str) -> int:
        """The pid of worker node `name`'s `ray start --block`, the parent of all its processes."""
        return int((self.state_dir / f"ray-worker-{name}" / "worker.pid").read_text())

    def lose(self, name: str) -> None:
        """Lose worker node `name` as a machine is lost: every process of it killed at once (SIGKILL), its raylet, its
        workers (actors, training ranks) and agents. Killing the raylet alone leaves its workers running for a while
        (they notice their raylet's death late), still answering their peers, as no lost machine does."""
        parent = psutil.Process(self.worker_pid(name))
        node = parent.children(recursive=True)
        raylets = [p for p in node if p.name() == "raylet"]
        assert len(raylets) == 1, f"worker node {name} has {len(raylets)} raylets"
        rest = [p for p in node if p.pid != raylets[0].pid]
        for process in [*raylets, *rest, parent]:  # the raylet first: nothing of the node is restarted by it
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.wait(60)
        self._script("stop-local-worker.sh", name, check=False)  # its pid file and temp dir: nothing runs now
        self.workers.remove(name)

    def stop(self) -> None:
        for name in list(self.workers):
            self._script("stop-local-worker.sh", name, check=False)
            self.workers.remove(name)
        self._script("stop-local-head.sh", check=False)

    def _script(self, script: str, *args: str, check: bool = True) -> None:
        done = subprocess.run(["bash", str(HERE / script), *args], env=self.env, capture_output=True, text=True,
                              timeout=180)
        if check and done.returncode != 0:
            raise RuntimeError(f"{script} {' '.join(args)} failed:\n{done.stdout}{done.stderr}")


def wait_for(condition, what: str, timeout: float = 300, poll: float = 0.05, alive=lambda: True) -> None:
    """Poll `condition` until it holds; `alive` says the process being watched still runs."""
    deadline = time.time() + timeout
    while not condition():
        if not alive():
            raise RuntimeError(f"ended before {what}")
        if time.time() > deadline:
            raise TimeoutError(f"no {what} after {timeout} s")
        time.sleep(poll)
