"""Run tracking: an MLflow run per pipeline run, or a do-nothing stand-in when tracking is off.

One MLflow run spans every stage of an output directory: rerunning a pipeline on the same directory
(to resume it, or to add stages) logs into the run it started, whose id is kept in `DIR/run.json`.

A tracking server that stops answering mid-run is reported as `TrackingUnavailable` (a ConnectionError
whose message says to start the server again and rerun) after seconds of retries, not after MLflow's
default of about four minutes per call: see `bound_http_retries`.
"""

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ppdkit.models.paths import cache_dir, write_json_atomic

from .config import TrackingConfig

log = logging.getLogger(__name__)


class Tracker(Protocol):
    run_id: str | None

    def ref(self) -> "TrackerRef": ...
    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_datasets(self, datasets: list["DatasetRecord"]) -> None: ...
    def finish(self, status: str = "FINISHED") -> None: ...


@dataclass(frozen=True)
class DatasetRecord:
    """A set of rows a run read, as the runs table's Datasets column and its dataset panel show it."""

    name: str  # the data source as the job spec names it: sharegpt, mt-bench, or a file's name
    context: str  # what the run did with it: training, validation (held out), evaluation (bench prompts)
    source: str  # the file or package folder it was read from
    digest: str  # of the rows themselves, so two runs on the same rows show the same digest
    profile: dict[str, Any]  # counts (num_rows, tokens, ...): the panel lists them as "key: value"
    schema: dict[str, str] | None = None  # column -> "string" | "long[]"


class TrackingUnavailable(ConnectionError):
    """The tracking server stopped answering mid-run; the message says what to do."""

    def __init__(self, uri: str, doing: str):
        self.uri, self.doing = uri, doing
        self.what = f"the MLflow tracking server {uri} stopped answering while {doing}"
        super().__init__(f"{self.what}. Start it again, then rerun the same command: finished stages are kept "
                         "and the interrupted one resumes")

    def __reduce__(self):  # raised in a Ray worker, it crosses to the driver pickled
        return type(self), (self.uri, self.doing)


# MLflow retries a failed HTTP request 7 times with backoff factor 2 (up to 120 s apart) and waits up
# to 120 s per try: a stopped server stalls every call for about 4 minutes, and a pipeline makes many.
# ppdkit's stages resume, so failing fast is better: 3 retries 0, 2 and 4 s apart (plus MLflow's
# jitter, up to 1 s each) report a refused connection in 7-9 s, a server that accepts but hangs within
# 4 x 20 s. Values the user set in the environment win.
HTTP_RETRY_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                       "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def bound_http_retries() -> None:
    """ppdkit's HTTP retry policy for the MLflow clients of this process and of the Ray workers it
    starts afterwards (they inherit the environment; MLflow reads it at every request)."""
    for name, value in HTTP_RETRY_SETTINGS.items():
        os.environ.setdefault(name, value)


@dataclass(frozen=True)
class TrackerRef:
    """A picklable handle to a run: worker processes (Ray Train ranks) open it to log into the same run."""

    uri: str | None = None
    run_id: str | None = None

    def open(self, best_effort: bool = False) -> "Tracker":
        """The run's tracker in this process. `best_effort`: a server that stops answering turns logging
        off with a warning instead of raising (for work that must not die with the server: training)."""
        if self.run_id is None:
            return NullTracker()
        from mlflow.tracking import MlflowClient

        bound_http_retries()  # a worker on another node did not inherit the driver's environment
        return MlflowTracker(MlflowClient(tracking_uri=self.uri), self.run_id, self.uri, best_effort=best_effort)


class NullTracker:
    run_id = None

    def ref(self) -> TrackerRef: return TrackerRef()

    def log_params(self, params): pass
    def log_metrics(self, metrics, step=None): pass
    def log_artifact(self, path, artifact_path=None): pass
    def set_tags(self, tags): pass
    def log_datasets(self, datasets): pass
    def finish(self, status="FINISHED"): pass


# The MLflow UI opens an experiment of this kind on its runs and charts (training), not on traces (GenAI)
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"


def experiment_tags() -> dict[str, str]:
    """The tags a ppdkit experiment carries: its kind, and the saved runs-table view of the key figures."""
    from .runs_view import VIEW_TAG, view_tag_value

    return {EXPERIMENT_KIND: MODEL_TRAINING, VIEW_TAG: view_tag_value()}


def _git(args: list[str], cwd: Path, timeout: float) -> str | None:
    """What `git ARGS` printed in `cwd`, or None where it could not say (no git, not a checkout)."""
    import subprocess

    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def ppdkit_commit() -> str | None:
    """The git commit of the ppdkit source running, when it runs from a checkout (None for an installed copy)."""
    out = _git(["rev-parse", "HEAD"], Path(__file__).parent, timeout=10)
    return out.strip() if out is not None else None


def ppdkit_uncommitted(root: Path | None = None) -> list[str] | None:
    """The tracked files under the checkout's ppdkit/ (code, components, the committed corpora) that differ from its
    commit, sorted: a report measured beside them did not measure `ppdkit_commit` alone (None for an installed
    copy)."""
    out = _git(["status", "--porcelain", "--untracked-files=no", "--", "ppdkit"],
               root or Path(__file__).resolve().parents[2], timeout=30)
    if out is None:
        return None
    return sorted(line[3:].split(" -> ")[-1] for line in out.splitlines() if line.strip())


def default_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{cache_dir() / 'mlflow' / 'mlflow.db'}"


def local_artifact_root() -> str:
    return (cache_dir() / "mlflow" / "artifacts").as_uri()


def metric_key(key: str) -> str:
    """MLflow allows letters, digits, _ - . / and space in metric names."""
    return re.sub(r"[^\w\-./ ]", "_", key)


def numeric_leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """{'data.train_sequences': 12.0, ...}: every number in a (nested) summary, booleans excluded."""
    out: dict[str, float] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(numeric_leaves(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[metric_key(name)] = float(value)
    return out


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def server_answers(uri: str) -> bool:
    import requests

    try:
        return requests.get(uri.rstrip("/") + "/health", timeout=5).ok
    except requests.RequestException:
        return False


def _check_server(uri: str) -> None:
    if is_server(uri) and not server_answers(uri):
        raise ConnectionError(
            f"MLflow tracking server {uri} is not reachable. Start one "
            "(`mlflow server --host 127.0.0.1 --port 5000`), fix tracking.uri / MLFLOW_TRACKING_URI, "
            "or set tracking.enabled=false"
        )


def server_call(uri: str, doing: str, fn, *args, **kwargs):
    """fn(*args, **kwargs) against the store at `uri`; when it fails because a tracking server stopped
    answering (not for a real error of the call), raise TrackingUnavailable saying what to do."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # MlflowException wraps HTTP failures; artifact transfers may raise requests' own
        if not is_server(uri) or server_answers(uri):
            raise
        raise TrackingUnavailable(uri, doing) from e


class MlflowTracker:
    def __init__(self, client, run_id: str, uri: str, best_effort: bool = False):
        self.client, self.run_id, self.uri = client, run_id, uri
        self.best_effort = best_effort
        self._off = False  # best effort: the server stopped answering once, nothing more is sent
        self._system = None  # MLflow's system metrics monitor, while the job runs

    @classmethod
    def start(cls, cfg: TrackingConfig, run_name: str, run_file: Path) -> "MlflowTracker":
        """Resume the run recorded in `run_file` if it exists on this server, else start a new one."""
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri = cfg.uri or default_tracking_uri()
        if uri.startswith("sqlite:///"):
            Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        bound_http_retries()  # before the job starts Ray: its workers inherit the policy
        _check_server(uri)
        client = MlflowClient(tracking_uri=uri)
        saved = _read_run_file(run_file)
        if saved.get("tracking_uri") == uri:
            try:
                server_call(uri, "resuming the run", client.update_run, saved["run_id"], status="RUNNING")
                log.info("MLflow: resuming run %s at %s", saved["run_id"], uri)
                return cls(client, saved["run_id"], uri)
            except MlflowException as e:  # e.g. a new, empty store behind the same address
                log.warning("MLflow: run %s named in %s is not in %s (%s); starting a new run",
                            saved["run_id"], run_file, uri, e.error_code)
        experiment = server_call(uri, "looking up the experiment", client.get_experiment_by_name, cfg.experiment)
        if experiment is None:
            local = uri.startswith("sqlite:") or uri.startswith("file:") or "://" not in uri
            experiment_id = server_call(uri, "creating the experiment", client.create_experiment, cfg.experiment,
                                        artifact_location=local_artifact_root() if local else None,
                                        tags=experiment_tags())
        else:
            experiment_id = experiment.experiment_id
            # one ppdkit made before it set these gets them; a user's choice (another kind, an edited view) stays
            for key, value in experiment_tags().items():
                if key not in experiment.tags:
                    server_call(uri, "tagging the experiment", client.set_experiment_tag, experiment_id, key, value)
        run = server_call(uri, "starting a run", client.create_run, experiment_id, run_name=run_name)
        run_file.parent.mkdir(parents=True, exist_ok=True)
        # atomic: a job killed while writing it must not leave a file the rerun cannot read
        write_json_atomic(run_file, {"tracking_uri": uri, "run_id": run.info.run_id, "experiment_id": experiment_id})
        log.info("MLflow: run %s in experiment %r at %s", run.info.run_id, cfg.experiment, uri)
        return cls(client, run.info.run_id, uri)

    def _call(self, doing: str, fn, *args, **kwargs):
        if self._off:
            return None
        try:
            return server_call(self.uri, doing, fn, *args, **kwargs)
        except TrackingUnavailable as e:
            if not self.best_effort:
                raise
            log.warning("%s; this process goes on without sending anything more to run %s", e.what, self.run_id)
            self._off = True
            return None

    def ref(self) -> TrackerRef:
        return TrackerRef(self.uri, self.run_id)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        run = self._call("reading the run's parameters", self.client.get_run, self.run_id)
        existing = run.data.params if run is not None else {}
        fresh = [Param(k, str(v)) for k, v in params.items() if k not in existing]
        for i in range(0, len(fresh), 100):  # MLflow takes at most 100 params per batch
            self._call("logging parameters", self.client.log_batch, self.run_id, params=fresh[i:i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(metric_key(k), float(v), now, step or 0) for k, v in metrics.items()]
        doing = "logging metrics" + (f" of step {step}" if step is not None else "")
        for i in range(0, len(batch), 1000):
            self._call(doing, self.client.log_batch, self.run_id, metrics=batch[i:i + 1000])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        upload = self.client.log_artifacts if Path(path).is_dir() else self.client.log_artifact
        self._call(f"uploading {Path(path).name}", upload, self.run_id, str(path), artifact_path)

    def set_tags(self, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self._call("setting tags", self.client.set_tag, self.run_id, key, str(value))

    def log_datasets(self, datasets: list[DatasetRecord]) -> None:
        from mlflow.entities import DatasetInput, InputTag

        inputs = [DatasetInput(dataset_entity(d), [InputTag(DATASET_CONTEXT, d.context)]) for d in datasets]
        if inputs:  # the store keeps one input per dataset and run: logging them again on a rerun adds nothing
            self._call("logging the datasets", self.client.log_inputs, self.run_id, datasets=inputs)

    def watch_system(self, every: float) -> None:
        """Log this machine's CPU, memory, disk and network use every `every` seconds as system/ metrics (MLflow's
        monitor, in a thread), so a user watching a long job sees what it costs; a resumed run continues its steps."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self._system = SystemMetricsMonitor(self.run_id, sampling_interval=every, resume_logging=True,
                                            tracking_uri=self.uri)
        self._system.start()

    def finish(self, status: str = "FINISHED") -> None:
        if self._system is not None:  # its last samples go out while the run is still RUNNING
            self._system.finish()
            self._system = None
        # finish also runs on the way out of a job that failed, perhaps because the server went away: it
        # must neither replace that reason nor wait through the retries again to learn the server is gone
        if is_server(self.uri) and not server_answers(self.uri):
            log.warning("MLflow: %s does not answer, so run %s stays marked RUNNING until a rerun finishes it",
                        self.uri, self.run_id)
            return
        try:
            self._call(f"marking the run {status}", self.client.set_terminated, self.run_id, status=status)
        except TrackingUnavailable as e:
            log.warning("%s (the run stays marked RUNNING until a rerun finishes it)", e)


DATASET_CONTEXT = "mlflow.data.context"  # the input tag the UI shows as the dataset's role (Training, ...)
_COLUMN_TYPES = {"string": "string", "long[]": ("array", "long")}


def dataset_entity(record: DatasetRecord):
    """The MLflow dataset of a record: a local source (the UI shows its path), the schema in MLflow's column form."""
    from mlflow.entities import Dataset
    from mlflow.types.schema import Array, ColSpec, Schema

    schema = None
    if record.schema is not None:
        unknown = {t for t in record.schema.values() if t not in _COLUMN_TYPES}
        if unknown:
            raise ValueError(f"dataset {record.name}: column type(s) {sorted(unknown)}; use {', '.join(_COLUMN_TYPES)}")
        specs = [ColSpec(Array(_COLUMN_TYPES[t][1]) if t.endswith("[]") else _COLUMN_TYPES[t], name)
                 for name, t in record.schema.items()]
        schema = json.dumps({"mlflow_colspec": Schema(specs).to_dict()})
    return Dataset(record.name, record.digest, "local", json.dumps({"uri": record.source}), schema,
                   json.dumps(record.profile))


def _read_run_file(run_file: Path) -> dict:
    if not run_file.is_file():
        return {}
    try:
        saved = json.loads(run_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError):
        log.warning("MLflow: %s is not readable JSON; starting a new run", run_file)
        return {}
    return saved if isinstance(saved, dict) and "run_id" in saved else {}


def start_tracker(cfg: TrackingConfig, run_name: str, run_file: Path) -> Tracker:
    if not cfg.enabled:
        return NullTracker()
    tracker = MlflowTracker.start(cfg, run_name, run_file)
    if cfg.system_metrics_every:
        tracker.watch_system(cfg.system_metrics_every)
    return tracker
