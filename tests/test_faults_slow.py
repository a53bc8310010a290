"""Faults in the pipeline (issue 12): a driver killed with SIGKILL, a tracking server stopped mid-run,
a full or read-only output. Real `ppdkit run` processes, real local Rays, a real `mlflow server`."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import requests
import torch
import yaml
from mlflow.tracking import MlflowClient

from conftest import FIXTURES, free_port
from ppdkit.data_pipeline.teacher_cache import TeacherCache
from ppdkit.cli.main import main
from ppdkit.models.artifact import write_component
from ppdkit.registry.models import COMPLETE_TAG, RegistryError, register_component
from ppdkit.registry.tracking import TrackerRef, TrackingUnavailable

pytestmark = pytest.mark.slow

PPDKIT = Path(sys.executable).with_name("ppdkit")
MLFLOW = Path(sys.executable).with_name("mlflow")
# what a killed driver's Ray leaves running for good (they wait on its dead GCS); everything else of it exits
LINGERING = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _in_session(sid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, PermissionError):
            pass
    return found


def _describe(processes: list[psutil.Process]) -> list[str]:
    return [" ".join(p.info["cmdline"] or [p.name()])[:60] for p in processes]


def _stop_all(started: list[int]) -> None:
    """Kill every process of the sessions `started`; `ps` must then show none of them running."""
    for sid in started:
        for p in _in_session(sid):
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    ids, deadline = {str(s) for s in started}, time.time() + 30
    while True:
        rows = subprocess.run(["ps", "-e", "-o", "sid=,stat=,args="], capture_output=True, text=True).stdout
        left = [r for r in rows.splitlines() if r.split()[0] in ids and "Z" not in r.split()[1]]
        if not left:
            return
        if time.time() > deadline:
            pytest.fail(f"processes left running: {left}")
        time.sleep(0.5)


@pytest.fixture
def sessions():
    """Session ids of everything a test starts (each process in its own session): stopped at the end."""
    started: list[int] = []
    yield started
    _stop_all(started)


class Job:
    """`ppdkit run ...` in its own session (so its embedded Ray can be found and stopped), logging to a file."""

    def __init__(self, args: list[str], log: Path, sessions: list[int]):
        self.log = log
        self.proc = subprocess.Popen([str(PPDKIT), "run", *args], stdout=log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        sessions.append(self.proc.pid)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, condition, what: str, timeout: float = 300, poll: float = 0.2) -> None:
        deadline = time.time() + timeout
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(f"the job ended (code {self.proc.returncode}) before {what}:\n{self.text()[-3000:]}")
            if time.time() > deadline:
                pytest.fail(f"no {what} after {timeout} s:\n{self.text()[-3000:]}")
            time.sleep(poll)

    def kill_driver(self) -> None:
        """SIGKILL the driver alone, as the OOM killer would; its embedded Ray is left to itself."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def finish(self, timeout: float = 600) -> int:
        return self.proc.wait(timeout)

    def wait_for_orphans(self) -> list[str]:
        """Wait until the killed driver's Ray has stopped working (workers, raylet, GCS); returns what it
        leaves running for good."""
        deadline = time.time() + 60
        while True:
            left = _in_session(self.proc.pid)
            working = [p for p in left if not any(name in " ".join(p.info["cmdline"] or []) for name in LINGERING)]
            if not working:
                return _describe(left)
            if time.time() > deadline:
                pytest.fail(f"the killed driver's Ray still works a minute later: {_describe(working)}")
            time.sleep(0.2)


class MlflowServer:
    """`mlflow server` on 127.0.0.1 with a sqlite store, stopped and started again by the test."""

    def __init__(self, root: Path, sessions: list[int]):
        self.root, self.sessions, self.port, self.proc = root, sessions, free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, wait: bool = True) -> None:
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
        self.proc = subprocess.Popen(
            [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--serve-artifacts",
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            env=env, stdout=(self.root / "server.log").open("a"), stderr=subprocess.STDOUT, start_new_session=True)
        self.sessions.append(self.proc.pid)
        if wait:
            self.ensure_running()

    def ensure_running(self) -> None:
        """Wait until the server answers, starting it first if it is not running."""
        if self.proc is None or self.proc.poll() is not None:
            self.start(wait=False)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if requests.get(f"{self.uri}/health", timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-2000:]
            time.sleep(0.3)
        pytest.fail("the MLflow server did not come up:\n" + (self.root / "server.log").read_text()[-2000:])

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for p in _in_session(self.proc.pid):  # uvicorn's worker, should it outlive its parent
            p.kill()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """One server for the module; it boots (8-15 s) while a test does other work until it calls
    `ensure_running`; a test that stops it starts it again."""
    started: list[int] = []
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"), started)
    server.start(wait=False)
    yield server
    _stop_all(started)


# ---------------------------------------------------------------------------------------------------
# A driver killed mid-teacher and mid-train, a server stopped mid-stage: the reruns give what an
# undisturbed run gives, and register exactly one version.

STEPS = 800


def _spec(tmp_path: Path, tracking_uri: str) -> Path:
    # the fixture three times over: 21 shards of one row, each regenerated (about 70 ms apiece), so a
    # driver can be killed between the first shard and the last
    lines = (FIXTURES / "conversations.jsonl").read_text().splitlines()
    data = tmp_path / "conversations.jsonl"
    data.write_text("\n".join(lines * 3) + "\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "faults",
        "base_model": {"name": "tiny-llama", "quantization": "none"},
        "data": {"source": str(data), "limit": None, "max_length": 64, "holdout": 0.3, "shards": 1,
                 "check_sequences": 0},
        "teacher": {"workers": 1, "top_k": 8, "rows_per_shard": 1, "batch_size": 1, "regenerate": True,
                    "max_new_tokens": 16, "generate_batch": 1},
        # a SIGKILLed driver's workers train on until Ray notices the dead job (measured: 1.7 s, 170 steps
        # of about 10 ms on the tiny model): STEPS leaves the rerun most of the run to resume
        "train": {"num_workers": 1, "micro_batch": 1, "groups_per_sequence": 4, "epochs": 100, "max_steps": STEPS,
                  "eval_every": 10, "checkpoint_every": 10, "log_every": 10, "eval_sequences": 2},
        "calibrate": {"sizes": [6], "sequences": 2, "max_rank": 3},
        "evaluate": {"limit": 1, "max_new_tokens": 4},
        "tracking": {"uri": tracking_uri, "experiment": "faults", "registered_model": "ppdkit-faults"},
        "ray": {"num_cpus": 2},
    }))
    return spec


def _shards(out: Path) -> dict:
    """The teacher's shard records without their timing (which worker, how fast): what two runs must agree on."""
    try:
        shards = json.loads((out / "teacher" / "manifest.json").read_text())["shards"]
    except (FileNotFoundError, ValueError):
        return {}
    return {name: {k: v for k, v in record.items() if k != "timing"} for name, record in shards.items()}


def _positions(out: Path) -> list[tuple]:
    """Every (split, row, position) the teacher cache holds targets for, duplicates kept."""
    cache = TeacherCache(out / "teacher")
    return [(split, seq.row, t) for split in ("train", "holdout") for seq in cache.sequences(split)
            for t in seq.positions.tolist()]


def test_killed_driver_and_stopped_server_then_rerun_matches_an_undisturbed_run(ray_local, mlflow_server,
                                                                                 sessions, tmp_path):
    spec = _spec(tmp_path, mlflow_server.uri)
    reference, out = tmp_path / "reference", tmp_path / "out"
    # the reference trains in this process (Ray Train's local mode): the same losses as the spec's one worker
    # (test_training's local-mode test), without a worker group to start
    assert main(["run", str(spec), "--stages", "data,teacher,train", "--output", str(reference),
                 "tracking.enabled=false", "train.num_workers=0"]) == 0
    mlflow_server.ensure_running()
    total = len(_shards(reference))
    # the data stage is not under test: the disturbed runs start from the reference's (same inputs)
    shutil.copytree(reference / "data", out / "data")
    run = [str(spec), "--output", str(out)]

    # 1. the driver SIGKILLed while the teacher has recorded some shards, not all
    job = Job(run, tmp_path / "1-kill-teacher.log", sessions)
    job.wait_for(lambda: len(_shards(out)) >= 1, "teacher shard", poll=0.002)
    job.kill_driver()
    assert 1 <= len(_shards(out)) < total
    assert not json.loads((out / "teacher" / "manifest.json").read_text())["complete"]
    job.wait_for_orphans()  # some of its Ray stays: the next run starts beside it

    # 2. the driver SIGKILLed after training wrote a checkpoint, before it finished
    job = Job(run, tmp_path / "2-kill-train.log", sessions)
    job.wait_for(lambda: (out / "train" / "checkpoints" / "latest.json").is_file(), "checkpoint")
    job.kill_driver()
    assert (out / "teacher" / "summary.json").is_file()
    job.wait_for_orphans()
    latest = json.loads((out / "train" / "checkpoints" / "latest.json").read_text())["step"]
    assert 10 <= latest < STEPS and not (out / "train" / "result.json").exists(), latest

    # 3. the tracking server stopped as calibration starts: the stage does its work, then a clear error
    job = Job(run, tmp_path / "3-server-stopped.log", sessions)
    job.wait_for(lambda: "stage calibrate: running" in job.text(), "calibrate stage")
    mlflow_server.stop()
    stopped = time.time()
    assert job.finish() == 2
    assert time.time() - stopped < 60  # bounded retries, not MLflow's default four minutes per call
    # the workers' lines go to the stage's log files, not the terminal
    assert f"resumed from step-{latest:06d}" in (out / "train" / "worker-0.log").read_text()
    error = job.text().strip().splitlines()[-1]
    # which of the stage's two uploads (the component, then its tree pictures) meets the stopped server depends on
    # how long the server takes to go down beside the calibration: either is the same clear error
    assert re.fullmatch(re.escape(f"ppdkit: error: the MLflow tracking server {mlflow_server.uri} stopped answering "
                                  "while uploading ") + "(component|trees)" +
                        re.escape(". Start it again, then rerun the same command: finished stages are kept and the "
                                  "interrupted one resumes"), error), error
    assert (out / "train" / "summary.json").is_file() and (out / "calibrate" / "component" / "trees.json").is_file()
    assert not (out / "calibrate" / "summary.json").exists()  # not marked complete: it never reached MLflow

    # 4. the server back, the same command once more: it finishes and registers exactly one version
    mlflow_server.start()
    job = Job(run, tmp_path / "4-finish.log", sessions)
    assert job.finish() == 0, job.text()[-3000:]

    assert _shards(out) == _shards(reference)  # the same shards, byte for byte (sha256)
    positions = _positions(out)
    assert len(positions) == len(set(positions)) and sorted(positions) == sorted(_positions(reference))
    disturbed = json.loads((out / "train" / "result.json").read_text())["history"]
    undisturbed = json.loads((reference / "train" / "result.json").read_text())["history"]
    assert [s for s, _ in disturbed] == [s for s, _ in undisturbed] == list(range(1, STEPS + 1))
    assert [loss for _, loss in disturbed] == pytest.approx([loss for _, loss in undisturbed], rel=1e-5)

    client = MlflowClient(mlflow_server.uri)
    versions = client.search_model_versions("name='ppdkit-faults'")
    assert [(str(v.version), v.tags.get(COMPLETE_TAG)) for v in versions] == [("1", "true")]
    assert str(client.get_model_version_by_alias("ppdkit-faults", "challenger").version) == "1"
    assert json.loads((out / "register" / "summary.json").read_text())["version"] == 1
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    assert client.get_run(run_id).info.status == "FINISHED"  # one MLflow run across the four processes


# ---------------------------------------------------------------------------------------------------
# Registration with the server stopped between its calls

class StopsServerAfterCreate(MlflowClient):
    """A client of the real server that stops the server right after it created the model version."""

    def __init__(self, server: MlflowServer):
        super().__init__(server.uri)
        self.server = server

    def create_model_version(self, *args, **kwargs):
        version = super().create_model_version(*args, **kwargs)
        self.server.stop()
        return version


def test_registration_interrupted_by_a_stopped_server_is_undone_by_the_rerun(mlflow_server, tmp_path, monkeypatch,
                                                                             caplog):
    # no retries: how long they take is the pipeline test's concern; here, what is left behind
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    mlflow_server.ensure_running()
    client = MlflowClient(mlflow_server.uri)
    run_id = client.create_run(client.create_experiment("reg")).info.run_id
    component = write_component(tmp_path / "component", "ept", {"tau": 2.0}, "tiny-llama", "sha256:" + "0" * 64,
                                {"mlflow_run_id": run_id}, {"prompt_embeddings": torch.zeros(3, 1, 4)})
    client.log_artifacts(run_id, str(component), "component")
    started = time.time()
    with pytest.raises(RegistryError, match="stopped answering while setting the challenger alias.*undoing it "
                                            "failed too.*removed, and the run registered again, by rerunning"):
        register_component(StopsServerAfterCreate(mlflow_server), "ppdkit-reg", run_id, {"tau": 2.0})
    assert time.time() - started < 30
    # the server down, a training rank's tracker goes on without it; the driver's says what to do
    ref = TrackerRef(mlflow_server.uri, run_id)
    rank0 = ref.open(best_effort=True)
    rank0.log_metrics({"train.loss": 1.0}, step=1)
    assert "stopped answering while logging metrics of step 1; this process goes on without" in caplog.text
    started = time.time()
    rank0.log_metrics({"train.loss": 0.5}, step=2)  # not even tried again
    assert time.time() - started < 0.5
    with pytest.raises(TrackingUnavailable, match="stopped answering while logging metrics of step 3. Start it "
                                                  "again, then rerun the same command"):
        ref.open().log_metrics({"train.loss": 0.4}, step=3)
    mlflow_server.start()
    [left] = client.search_model_versions("name='ppdkit-reg'")
    assert COMPLETE_TAG not in left.tags and not left.aliases  # incomplete, and nobody's challenger
    assert register_component(client, "ppdkit-reg", run_id, {"tau": 2.0}) == "2"
    versions = client.search_model_versions("name='ppdkit-reg'")
    assert [(str(v.version), v.tags.get(COMPLETE_TAG)) for v in versions] == [("2", "true")]
    assert str(client.get_model_version_by_alias("ppdkit-reg", "challenger").version) == "2"


# ---------------------------------------------------------------------------------------------------
# A full disk and a read-only output

@contextmanager
def _tmpfs(path: Path, size: str):
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to simulate a full disk ({mounted.stderr.strip()}): needs root "
                    "or CAP_SYS_ADMIN")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def test_full_and_read_only_output_are_one_line_errors(ray_local, tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "disk", "base_model": {"name": "tiny-llama", "quantization": "none"},
        "data": {"source": str(FIXTURES / "conversations.jsonl"), "limit": None, "max_length": 64, "holdout": 0.3,
                 "shards": 1, "check_sequences": 0},
        "tracking": {"enabled": False}}))
    with _tmpfs(tmp_path / "disk", "2m") as disk:
        # full but for 16 KiB: the spec fits, the data stage's datasets do not
        (disk / "filler").write_bytes(b"\0" * (2 * 2**20 - 16 * 2**10))
        out = disk / "out"
        assert main(["run", str(spec), "--stages", "data", "--output", str(out)]) == 2
        err = capsys.readouterr().err  # progress bars before it, no traceback
        assert err.strip().splitlines()[-1] == (
            f"ppdkit: error: the output directory {out}: No space left on device. Free space there or choose "
            "another --output, then rerun the same command: finished stages are kept") and "Traceback" not in err
        assert not (out / "data" / "summary.json").exists()  # the failed stage is not marked complete

        (disk / "filler").unlink()  # space again: the same command finishes the stage
        assert main(["run", str(spec), "--stages", "data", "--output", str(out)]) == 0
        assert json.loads((out / "data" / "summary.json").read_text())["train_sequences"] == 5

        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        capsys.readouterr()
        assert main(["run", str(spec), "--stages", "data", "--output", str(disk / "other")]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [  # refused before any work: nothing else printed
            f"ppdkit: error: the output directory {disk / 'other'}: Read-only file system. Choose an --output on a "
            "writable file system, then rerun the same command: finished stages are kept"]

