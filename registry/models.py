"""The MLflow model registry: component versions, `challenger`/`champion` aliases, `models:/` URIs.

A version's source is the run's `component` artifact (component.json, weights, trees.json); its tags
carry what a user compares (method, base model, fingerprint, accuracy by distance, expected tokens
per step, measured speedup). Promotion moves `champion` only to a version at least as good as the
current one on the stored calibration figure (tau), unless forced.
"""

import logging
import re
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ppdkit.models.paths import cache_dir

from .tracking import default_tracking_uri

log = logging.getLogger(__name__)

URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")
QUALITY_TAG = "tau"  # expected tokens per decoding step of the chosen tree, from calibration


class RegistryError(ValueError):
    pass


def client(uri: str | None = None) -> MlflowClient:
    return MlflowClient(tracking_uri=uri or default_tracking_uri(), registry_uri=uri or default_tracking_uri())


def register_component(mlflow: MlflowClient, name: str, run_id: str, tags: dict[str, str]) -> str:
    """A new version of `name` from the run's `component` artifact, tagged, aliased `challenger`."""
    try:
        mlflow.get_registered_model(name)
    except MlflowException:
        mlflow.create_registered_model(name, description="PPD prompt tokens trained by ppdkit")
    source = f"{mlflow.get_run(run_id).info.artifact_uri}/component"
    version = mlflow.create_model_version(name, source=source, run_id=run_id, tags={k: str(v) for k, v in tags.items()})
    mlflow.set_registered_model_alias(name, "challenger", version.version)
    log.info("registered %s version %s (alias challenger)", name, version.version)
    return str(version.version)


def promote(mlflow: MlflowClient, name: str, version: str, force: bool = False) -> str:
    """Move `champion` to `version` if it is at least as good as the current champion (or forced)."""
    candidate = _version(mlflow, name, version)
    try:
        current = mlflow.get_model_version_by_alias(name, "champion")
    except MlflowException:
        current = None
    if current is not None and not force:
        new, old = _quality(candidate), _quality(current)
        if new < old:
            raise RegistryError(f"{name} version {version} has {QUALITY_TAG}={new:.3f}, below the champion "
                                f"(version {current.version}, {QUALITY_TAG}={old:.3f}); use --force to promote anyway")
    mlflow.set_registered_model_alias(name, "champion", candidate.version)
    return f"{name} version {candidate.version} is now champion" + (
        f" (was version {current.version})" if current is not None else "")


def _version(mlflow: MlflowClient, name: str, version: str):
    try:
        return mlflow.get_model_version(name, str(version))
    except MlflowException:
        raise RegistryError(f"no version {version} of registered model {name!r}") from None


def _quality(version) -> float:
    try:
        return float(version.tags[QUALITY_TAG])
    except (KeyError, ValueError):
        raise RegistryError(f"version {version.version} has no {QUALITY_TAG} tag to compare (register it with "
                            "the calibrate stage's figures, or use --force)") from None


def resolve(uri: str, tracking_uri: str | None = None) -> Path:
    """models:/NAME@ALIAS or models:/NAME/VERSION -> a local component directory (downloaded once)."""
    match = URI.match(uri)
    if not match:
        raise RegistryError(f"{uri!r} is not models:/NAME@ALIAS or models:/NAME/VERSION")
    mlflow = client(tracking_uri)
    name = match["name"]
    try:
        version = (mlflow.get_model_version_by_alias(name, match["alias"]) if match["alias"]
                   else mlflow.get_model_version(name, match["version"]))
    except MlflowException as e:
        known = [m.name for m in mlflow.search_registered_models()]
        raise RegistryError(f"{uri}: not found in the registry at {mlflow.tracking_uri} ({e.error_code}); "
                            f"registered models: {', '.join(known) or 'none'}") from None
    target = cache_dir() / "registry" / name / str(version.version)
    if not (target / "component" / "component.json").is_file():
        import mlflow as mlflow_module

        target.mkdir(parents=True, exist_ok=True)
        mlflow_module.artifacts.download_artifacts(artifact_uri=version.source, dst_path=str(target),
                                                   tracking_uri=mlflow.tracking_uri)
    return target / "component"
