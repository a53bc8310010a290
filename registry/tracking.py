"""Run tracking: an MLflow run per pipeline run, or a do-nothing stand-in when tracking is off.

One MLflow run spans every stage of an output directory: rerunning a pipeline on the same directory
(to resume it, or to add stages) logs into the run it started, whose id is kept in `DIR/run.json`.
"""

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ppdkit.models.paths import cache_dir

from .config import TrackingConfig

log = logging.getLogger(__name__)


class Tracker(Protocol):
    run_id: str | None

    def ref(self) -> "TrackerRef": ...
    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def finish(self, status: str = "FINISHED") -> None: ...


@dataclass(frozen=True)
class TrackerRef:
    """A picklable handle to a run: worker processes (Ray Train ranks) open it to log into the same run."""

    uri: str | None = None
    run_id: str | None = None

    def open(self) -> "Tracker":
        if self.run_id is None:
            return NullTracker()
        from mlflow.tracking import MlflowClient

        return MlflowTracker(MlflowClient(tracking_uri=self.uri), self.run_id, self.uri)


class NullTracker:
    run_id = None

    def ref(self) -> TrackerRef: return TrackerRef()

    def log_params(self, params): pass
    def log_metrics(self, metrics, step=None): pass
    def log_artifact(self, path, artifact_path=None): pass
    def set_tags(self, tags): pass
    def finish(self, status="FINISHED"): pass


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


def _check_server(uri: str) -> None:
    if not uri.startswith(("http://", "https://")):
        return
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=5).raise_for_status()
    except requests.RequestException as e:
        raise ConnectionError(
            f"MLflow tracking server {uri} is not reachable ({e.__class__.__name__}). Start one "
            "(`mlflow server --host 127.0.0.1 --port 5000`), fix tracking.uri / MLFLOW_TRACKING_URI, "
            "or set tracking.enabled=false"
        ) from None


class MlflowTracker:
    def __init__(self, client, run_id: str, uri: str):
        self.client, self.run_id, self.uri = client, run_id, uri

    @classmethod
    def start(cls, cfg: TrackingConfig, run_name: str, run_file: Path) -> "MlflowTracker":
        """Resume the run recorded in `run_file` if it exists on this server, else start a new one."""
        from mlflow.tracking import MlflowClient

        uri = cfg.uri or default_tracking_uri()
        if uri.startswith("sqlite:///"):
            Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        _check_server(uri)
        client = MlflowClient(tracking_uri=uri)
        if run_file.is_file():
            saved = json.loads(run_file.read_text())
            if saved.get("tracking_uri") == uri:
                client.update_run(saved["run_id"], status="RUNNING")
                log.info("MLflow: resuming run %s at %s", saved["run_id"], uri)
                return cls(client, saved["run_id"], uri)
        experiment = client.get_experiment_by_name(cfg.experiment)
        if experiment is None:
            local = uri.startswith("sqlite:") or uri.startswith("file:") or "://" not in uri
            experiment_id = client.create_experiment(cfg.experiment, artifact_location=local_artifact_root() if local else None)
        else:
            experiment_id = experiment.experiment_id
        run = client.create_run(experiment_id, run_name=run_name)
        run_file.parent.mkdir(parents=True, exist_ok=True)
        run_file.write_text(json.dumps({"tracking_uri": uri, "run_id": run.info.run_id,
                                        "experiment_id": experiment_id}, indent=2))
        log.info("MLflow: run %s in experiment %r at %s", run.info.run_id, cfg.experiment, uri)
        return cls(client, run.info.run_id, uri)

    def ref(self) -> TrackerRef:
        return TrackerRef(self.uri, self.run_id)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        fresh = [Param(k, str(v)) for k, v in params.items() if k not in existing]
        for i in range(0, len(fresh), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=fresh[i:i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(metric_key(k), float(v), now, step or 0) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        if Path(path).is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value))

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


def start_tracker(cfg: TrackingConfig, run_name: str, run_file: Path) -> Tracker:
    return MlflowTracker.start(cfg, run_name, run_file) if cfg.enabled else NullTracker()
