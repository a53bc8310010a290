"""Registered versions, the champion gate, models:/ resolution, and what runs record for the UI (datasets, the
key-figures view), on a real MLflow store."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ppdkit.models.artifact import WEIGHTS_FILE, read_component, write_component
from ppdkit.models.paths import cache_dir
from ppdkit.registry.models import COMPLETE_TAG, RegistryError, promote, register_component, resolve


@pytest.fixture(scope="module")
def registry_uri(tmp_path_factory):
    """One real sqlite store for the module (creating one costs seconds); each test registers its own model."""
    root = tmp_path_factory.mktemp("registry")
    return f"sqlite:///{root / 'mlflow.db'}", root / "artifacts"


@pytest.fixture
def store(registry_uri, tmp_path, request):
    uri, artifacts = registry_uri
    client = MlflowClient(uri)
    name = f"ppdkit-{request.node.name}".replace("[", "-").replace("]", "")
    exp = client.create_experiment(name, artifact_location=(artifacts / name).as_uri())

    def new_run(tau: float | None) -> str:
        """A run holding a real component artifact (checksummed files, as the pipeline logs it)."""
        run = client.create_run(exp)
        comp = write_component(tmp_path / f"comp-{run.info.run_id}", "ept", {"tau": tau}, "tiny-llama",
                               "sha256:" + "0" * 64, {"mlflow_run_id": run.info.run_id},
                               {"prompt_embeddings": torch.full((3, 1, 4), 0.5)})
        client.log_artifacts(run.info.run_id, str(comp), "component")
        return run.info.run_id

    def new_version(tau: float | None, mlflow: MlflowClient = client) -> str:
        tags = {"method": "ept"} if tau is None else {"method": "ept", "tau": tau}
        return register_component(mlflow, name, new_run(tau), tags)

    return Store(client, name, uri, artifacts / name, new_version, new_run)


class Store(NamedTuple):
    client: MlflowClient
    name: str  # the registered model of this test
    uri: str
    artifacts: Path
    new_version: Callable
    new_run: Callable


def test_register_promote_and_the_champion_gate(store):
    client, new_version = store.client, store.new_version
    assert new_version(2.0) == "1"
    assert str(client.get_model_version_by_alias(store.name, "challenger").version) == "1"
    assert "now champion" in promote(client, store.name, "1")
    assert new_version(1.5) == "2"
    with pytest.raises(RegistryError, match="below the champion"):
        promote(client, store.name, "2")
    assert str(client.get_model_version_by_alias(store.name, "champion").version) == "1"
    promote(client, store.name, "2", force=True)
    assert str(client.get_model_version_by_alias(store.name, "champion").version) == "2"
    assert new_version(1.5) == "3"
    promote(client, store.name, "3")  # as good as the champion is enough
    with pytest.raises(RegistryError, match="no version 9"):
        promote(client, store.name, "9")


def test_resolve_downloads_the_component(store):
    new_version = store.new_version
    new_version(2.0)
    path = resolve(f"models:/{store.name}@challenger", store.uri)
    assert read_component(path).hyperparameters["tau"] == 2.0
    assert resolve(f"models:/{store.name}/1", store.uri) == path


def test_unknown_names_and_aliases_are_clear(store):
    new_version = store.new_version
    new_version(2.0)
    with pytest.raises(RegistryError, match=f"registered models: .*{store.name}"):
        resolve(f"models:/{store.name}@champion", store.uri)
    with pytest.raises(RegistryError, match="is not models:/NAME@ALIAS"):
        resolve("models:/a/b/c", store.uri)


def _versions(store: Store) -> list:
    return sorted(store.client.search_model_versions(f"name='{store.name}'"), key=lambda v: int(v.version))


def test_registering_a_run_again_gives_its_version_not_a_new_one(store):
    client, new_run = store.client, store.new_run
    run_id = new_run(2.0)
    assert register_component(client, store.name, run_id, {"tau": 2.0}) == "1"
    assert register_component(client, store.name, run_id, {"tau": 2.0}) == "1"  # a rerun after a crash
    assert [str(v.version) for v in _versions(store)] == ["1"]
    # other figures for the same run (a stage redone with --force) are a new version
    assert register_component(client, store.name, run_id, {"tau": 2.5}) == "2"


class FailsAt(MlflowClient):
    """A client of the real store whose call `method` fails once, as a stopped server's would."""

    def __init__(self, uri: str, method: str):
        super().__init__(uri)
        self.method, self.failed = method, False
        setattr(self, method, self._fail_once(getattr(self, method)))

    def _fail_once(self, call):
        def wrapper(*args, **kwargs):
            if not self.failed:
                self.failed = True
                raise MlflowException(f"{self.method} failed (injected)")
            return call(*args, **kwargs)
        return wrapper


@pytest.mark.parametrize("method", ["set_registered_model_alias", "set_model_version_tag"])
def test_a_registration_that_fails_after_the_version_is_created_leaves_nothing(store, method):
    client, new_version = store.client, store.new_version
    assert new_version(2.0) == "1"  # the current challenger
    failing = FailsAt(store.uri, method)
    with pytest.raises(MlflowException, match="injected"):
        new_version(3.0, failing)
    assert failing.failed
    assert [str(v.version) for v in _versions(store)] == ["1"]  # version 2 was created, then removed again
    assert str(client.get_model_version_by_alias(store.name, "challenger").version) == "1"
    assert new_version(3.0) == "3"
    assert client.get_model_version(store.name, "3").tags[COMPLETE_TAG] == "true"


def test_an_incomplete_version_of_the_run_is_replaced(store):
    client, new_run = store.client, store.new_run
    run_id = new_run(2.0)
    # what a registration killed between its calls leaves: a version without the completion tag
    source = f"{client.get_run(run_id).info.artifact_uri}/component"
    client.create_registered_model(store.name)
    client.create_model_version(store.name, source=source, run_id=run_id, tags={"tau": "2.0"})
    assert register_component(client, store.name, run_id, {"tau": 2.0}) == "2"
    assert [(str(v.version), v.tags.get(COMPLETE_TAG)) for v in _versions(store)] == [("2", "true")]


def _artifact_weights(store: Store, run_id: str) -> Path:
    [path] = store.artifacts.glob(f"{run_id}/artifacts/component/{WEIGHTS_FILE}")
    return path


def test_a_damaged_cached_copy_is_downloaded_again(store):
    new_version = store.new_version
    new_version(2.0)
    path = resolve(f"models:/{store.name}/1", store.uri)
    weights = path / WEIGHTS_FILE
    weights.write_bytes(weights.read_bytes()[:-8])  # truncated on disk
    assert resolve(f"models:/{store.name}/1", store.uri) == path
    assert read_component(path).tensors["prompt_embeddings"].eq(0.5).all()


def test_a_damaged_registry_artifact_is_refused_and_nothing_is_cached(store, tmp_path, monkeypatch):
    monkeypatch.setenv("PPDKIT_CACHE", str(tmp_path / "cache"))  # this test's own download cache
    client, new_run = store.client, store.new_run
    run_id = new_run(2.0)
    register_component(client, store.name, run_id, {"tau": 2.0})
    stored = _artifact_weights(store, run_id)
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the registry's copy
    stored.write_bytes(bytes(data))
    with pytest.raises(RegistryError, match="damaged in the registry: a fresh download .* fails its checks too"):
        resolve(f"models:/{store.name}@challenger", store.uri)
    models = cache_dir() / "registry" / store.name
    assert not list(models.glob("1-*")) and not list(models.glob(".download-*"))
    # the same after a good copy was cached and then damaged: downloaded once more, refused
    stored.write_bytes(bytes(data[:-1]) + bytes([data[-1] ^ 0xFF]))
    path = resolve(f"models:/{store.name}@challenger", store.uri)
    (path / WEIGHTS_FILE).write_bytes(bytes(data))  # the cached copy damaged, and the registry's too
    stored.write_bytes(bytes(data))
    with pytest.raises(RegistryError, match="damaged in the registry"):
        resolve(f"models:/{store.name}@challenger", store.uri)
    assert not list(models.glob("1-*"))


def test_a_run_logs_its_datasets_as_the_runs_table_shows_them(registry_uri, tmp_path):
    from ppdkit.registry.config import TrackingConfig
    from ppdkit.registry.tracking import DatasetRecord, MlflowTracker

    uri, _ = registry_uri
    tracker = MlflowTracker.start(TrackingConfig(uri=uri, experiment="datasets"), "run", tmp_path / "run.json")
    train = DatasetRecord("sharegpt", "training", "/data/sharegpt", "0a1b2c3d", {"num_rows": 56, "tokens": 9000},
                          {"id": "string", "input_ids": "long[]"})
    held_out = DatasetRecord("sharegpt", "validation", "/data/sharegpt", "4e5f6a7b", {"num_rows": 8})
    tracker.log_datasets([train, held_out])
    tracker.log_datasets([train])  # a rerun logs the same dataset again: still one input
    inputs = MlflowClient(uri).get_run(tracker.run_id).inputs.dataset_inputs
    by_context = {i.tags[0].value: i.dataset for i in inputs}
    assert len(inputs) == 2 and [t.key for i in inputs for t in i.tags] == ["mlflow.data.context"] * 2
    assert {c: (d.name, d.digest) for c, d in by_context.items()} == {"training": ("sharegpt", "0a1b2c3d"),
                                                                    "validation": ("sharegpt", "4e5f6a7b")}
    trained = by_context["training"]
    assert trained.source_type == "local" and json.loads(trained.source) == {"uri": "/data/sharegpt"}
    assert json.loads(trained.profile) == {"num_rows": 56, "tokens": 9000}
    columns = json.loads(trained.schema)["mlflow_colspec"]
    assert [(c["name"], c["type"]) for c in columns] == [("id", "string"), ("input_ids", "array")]
    assert columns[1]["items"] == {"type": "long"}
    with pytest.raises(ValueError, match=r"column type\(s\) \['int'\]; use string, long\[\]"):
        tracker.log_datasets([DatasetRecord("x", "training", "/x", "0", {}, {"id": "int"})])


def test_the_experiment_carries_the_key_figures_view_and_keeps_a_users_edit(registry_uri, tmp_path):
    from ppdkit.registry.config import TrackingConfig
    from ppdkit.registry.runs_view import VIEW_TAG, runs_view_url
    from ppdkit.registry.tracking import MlflowTracker

    uri, _ = registry_uri
    client = MlflowClient(uri)
    cfg = TrackingConfig(uri=uri, experiment="views")
    tracker = MlflowTracker.start(cfg, "run", tmp_path / "a" / "run.json")
    experiment = client.get_experiment(client.get_run(tracker.run_id).info.experiment_id)
    # the envelope the UI's views menu parses: a name, times in ms, and the page state as a JSON string
    envelope = json.loads(experiment.tags[VIEW_TAG])
    assert envelope["name"] == "ppdkit key figures" and envelope["createdAt"] == envelope["updatedAt"] > 0
    state = json.loads(envelope["state"])
    assert state["selectedColumns"] == ["tags.`method`", "tags.`decode_method`", "metrics.`tokens_per_step`",
                                        "metrics.`x_ar`", "metrics.`identical`", "metrics.`tokens_per_s`",
                                        "attributes.`Dataset`"]
    assert runs_view_url("http://127.0.0.1:5000/", experiment.experiment_id) == (
        f"http://127.0.0.1:5000/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning"
        "&viewStateShareKey=ppdkit-key-figures")
    # a view the user changed in the UI is not overwritten; one that is gone (or never was) is saved again
    client.set_experiment_tag(experiment.experiment_id, VIEW_TAG, "edited")
    MlflowTracker.start(cfg, "run", tmp_path / "b" / "run.json")
    assert client.get_experiment(experiment.experiment_id).tags[VIEW_TAG] == "edited"
    client.delete_experiment_tag(experiment.experiment_id, VIEW_TAG)
    MlflowTracker.start(cfg, "run", tmp_path / "c" / "run.json")
    assert json.loads(client.get_experiment(experiment.experiment_id).tags[VIEW_TAG])["name"] == "ppdkit key figures"


def test_a_run_logs_system_metrics_while_it_runs(registry_uri, tmp_path):
    """start_tracker starts MLflow's system metrics monitor on the run; finish flushes its samples and stops it."""
    import time

    from ppdkit.registry.config import TrackingConfig
    from ppdkit.registry.tracking import start_tracker

    uri, _ = registry_uri
    tracker = start_tracker(TrackingConfig(uri=uri, experiment="system", system_metrics_every=0.5), "run",
                            tmp_path / "run.json")
    time.sleep(2.0)
    tracker.finish()
    metrics = MlflowClient(uri).get_run(tracker.run_id).data.metrics
    assert "system/cpu_utilization_percentage" in metrics and "system/system_memory_usage_megabytes" in metrics
    quiet = start_tracker(TrackingConfig(uri=uri, experiment="system", system_metrics_every=None), "quiet",
                          tmp_path / "quiet.json")
    quiet.finish()
    assert not [k for k in MlflowClient(uri).get_run(quiet.run_id).data.metrics if k.startswith("system/")]
