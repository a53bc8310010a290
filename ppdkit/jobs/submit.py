"""`ppdkit submit` and `ppdkit jobs ...`: the whole pipeline as a Ray job on a running cluster.

The job carries the project in its runtime_env (the `ppdkit` package as a py_module, the resolved
spec in its working_dir); the cluster provides the dependencies (its image or environment).
"""

import asyncio
import os
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

import requests
import yaml

from .spec import JobSpec

SUBMIT_PATIENCE_S = 180  # how long a just-started head may take to accept jobs
OVERRIDING_VARIABLES = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")  # Ray's client prefers these to its argument


class JobFailed(RuntimeError):
    pass


def client(address: str):
    """The job API at `address`, and no other. Ray's client lets RAY_API_SERVER_ADDRESS or RAY_ADDRESS in
    the environment override the address it is given, so a shell (or a process of an embedded Ray, which
    carries its own state-API address) would send `--address`'s jobs to another cluster: hidden here."""
    from ray.job_submission import JobSubmissionClient

    hidden = {name: os.environ.pop(name) for name in OVERRIDING_VARIABLES if name in os.environ}
    try:
        return JobSubmissionClient(address)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ConnectionError(f"no Ray job API at {address} ({e.__class__.__name__}: {e}). Start a head "
                              "(infra/ray/start-local-head.sh) or pass the dashboard address, e.g. "
                              "http://HEAD:8265") from None
    finally:
        os.environ.update(hidden)


def _stage_package(into: Path, with_corpora: bool = False) -> Path:
    """A copy of the installed `ppdkit` package, whatever the install layout (editable or wheel); the committed
    corpora (tens of MB) only for a job that reads one."""
    import ppdkit

    pkg = into / "ppdkit"
    skipped = ("__pycache__", "*.pyc", ".grow.lock", *(() if with_corpora else ("corpora",)))
    shutil.copytree(Path(ppdkit.__file__).parent, pkg, ignore=shutil.ignore_patterns(*skipped))
    return pkg


def _is_loopback(address: str) -> bool:
    host = urlparse(address if "://" in address else f"http://{address}").hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


def entrypoint(spec_file: str, output: str | None, python: str = "python", overrides: Sequence[str] = ()) -> str:
    """The command a ppdkit Ray job runs: `ppdkit run` on a spec file the cluster holds, by the cluster's interpreter
    (`python`: the one on the PATH of the node that runs it). `ppdkit submit` and the KubeRay RayJob
    (jobs/kuberay.py) both run this one. Quoted for the shell Ray runs an entrypoint in (an override's `[a, b]`)."""
    entry = [python, "-m", "ppdkit.cli.main", "run", spec_file, *overrides]
    if output:
        entry += ["--output", output]
    return shlex.join(entry)


def submit(spec: JobSpec, address: str, output: str | None, python: str | None, env: dict[str, str]) -> str:
    jobs = client(address)
    staging = Path(tempfile.mkdtemp(prefix="ppdkit-submit-"))
    try:
        package = _stage_package(staging / "package", with_corpora=spec.data.source == "corpus")
        workdir = staging / "work"
        workdir.mkdir()
        (workdir / "job.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
        # A head on this machine runs the entrypoint with its own PATH: name this interpreter.
        interpreter = python or (sys.executable if _is_loopback(address) else "python")
        # The id is chosen here so that a submission whose answer was lost can be retried safely.
        submission_id = f"ppdkit-{spec.name}-{uuid.uuid4().hex[:10]}"
        deadline = time.monotonic() + SUBMIT_PATIENCE_S
        while True:
            try:
                return jobs.submit_job(
                    entrypoint=entrypoint("job.yaml", output, interpreter), submission_id=submission_id,
                    runtime_env={"py_modules": [str(package)], "working_dir": str(workdir), "env_vars": env},
                    metadata={"ppdkit_job": spec.name},
                )
            except (RuntimeError, requests.exceptions.ConnectionError) as e:
                # A head that just started answers before its job agent is up ("No available agent"),
                # or drops the connection while the agent starts.
                transient = isinstance(e, requests.exceptions.ConnectionError) or "No available agent" in str(e)
                if _already_submitted(jobs, submission_id):
                    return submission_id
                if not transient or time.monotonic() > deadline:
                    if isinstance(e, requests.exceptions.ConnectionError):
                        raise ConnectionError(f"the Ray job API at {address} kept dropping the submission "
                                              f"for {SUBMIT_PATIENCE_S} s ({e}); check the head's dashboard "
                                              "and agent logs (`ray status`, the head's log)") from None
                    raise
                time.sleep(2)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _already_submitted(jobs, submission_id: str) -> bool:
    try:
        jobs.get_job_info(submission_id)
        return True
    except Exception:  # not found, or the head still unreachable
        return False


def status(address: str, job_id: str) -> str:
    return str(client(address).get_job_status(job_id))


def logs(address: str, job_id: str, follow: bool) -> None:
    jobs = client(address)
    if not follow:
        print(jobs.get_job_logs(job_id), end="")
        return

    async def tail() -> None:
        async for lines in jobs.tail_job_logs(job_id):
            print(lines, end="", flush=True)

    asyncio.run(tail())


def wait(address: str, job_id: str, poll: float = 2.0, timeout: float | None = None) -> str:
    """Block until the job ends; raise with its last log lines if it did not succeed."""
    jobs, started = client(address), time.time()
    while True:
        state = str(jobs.get_job_status(job_id))
        if state in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        if timeout is not None and time.time() - started > timeout:
            raise TimeoutError(f"job {job_id} still {state} after {timeout:.0f} s")
        time.sleep(poll)
    if state != "SUCCEEDED":
        tail = "\n".join(jobs.get_job_logs(job_id).splitlines()[-25:])
        raise JobFailed(f"job {job_id} {state}; its last log lines:\n{tail}")
    return state


def list_jobs(address: str) -> list[dict]:
    rows = []
    for job in client(address).list_jobs():
        rows.append({"id": job.submission_id, "status": str(job.status), "name": (job.metadata or {}).get("ppdkit_job", ""),
                     "entrypoint": job.entrypoint})
    return rows


def stop(address: str, job_id: str) -> bool:
    return client(address).stop_job(job_id)
