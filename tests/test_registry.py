"""Registered versions, the champion gate and models:/ resolution on a real MLflow store."""

import json

import pytest
from mlflow.tracking import MlflowClient

from ppdkit.registry.models import RegistryError, promote, register_component, resolve


@pytest.fixture
def store(tracking_uri, tmp_path):
    client = MlflowClient(tracking_uri)
    exp = client.create_experiment("reg", artifact_location=(tmp_path / "artifacts").as_uri())

    def new_version(tau: float | None) -> str:
        run = client.create_run(exp)
        comp = tmp_path / f"comp-{run.info.run_id}"
        comp.mkdir()
        (comp / "component.json").write_text(json.dumps({"method": "ept", "tau": tau}))
        client.log_artifacts(run.info.run_id, str(comp), "component")
        tags = {"method": "ept"} if tau is None else {"method": "ept", "tau": tau}
        return register_component(client, "ppdkit-test", run.info.run_id, tags)

    return client, new_version


def test_register_promote_and_the_champion_gate(store):
    client, new_version = store
    assert new_version(2.0) == "1"
    assert str(client.get_model_version_by_alias("ppdkit-test", "challenger").version) == "1"
    assert "now champion" in promote(client, "ppdkit-test", "1")
    assert new_version(1.5) == "2"
    with pytest.raises(RegistryError, match="below the champion"):
        promote(client, "ppdkit-test", "2")
    assert str(client.get_model_version_by_alias("ppdkit-test", "champion").version) == "1"
    promote(client, "ppdkit-test", "2", force=True)
    assert str(client.get_model_version_by_alias("ppdkit-test", "champion").version) == "2"
    assert new_version(1.5) == "3"
    promote(client, "ppdkit-test", "3")  # as good as the champion is enough
    with pytest.raises(RegistryError, match="no version 9"):
        promote(client, "ppdkit-test", "9")


def test_resolve_downloads_the_component(store, tracking_uri):
    _, new_version = store
    new_version(2.0)
    path = resolve("models:/ppdkit-test@challenger", tracking_uri)
    assert json.loads((path / "component.json").read_text())["tau"] == 2.0
    assert resolve("models:/ppdkit-test/1", tracking_uri) == path


def test_unknown_names_and_aliases_are_clear(store, tracking_uri):
    _, new_version = store
    new_version(2.0)
    with pytest.raises(RegistryError, match="registered models: ppdkit-test"):
        resolve("models:/ppdkit-test@champion", tracking_uri)
    with pytest.raises(RegistryError, match="is not models:/NAME@ALIAS"):
        resolve("models:/a/b/c", tracking_uri)
