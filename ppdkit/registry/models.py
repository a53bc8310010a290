"""The MLflow model registry: component versions, `challenger`/`champion` aliases, `models:/` URIs.

A version's source is the run's `model` artifact: an MLflow pyfunc model (registry/pyfunc.py) holding the
component (component.json, weights, trees.json) as its data (older versions: the run's
`component` artifact itself), so `mlflow.pyfunc.load_model` decodes with it too; its tags
carry what a user compares (method, base model, fingerprint, accuracy by distance, expected tokens
per step, measured speedup). Promotion moves `champion` only to a version at least as good as the
current one on the stored calibration figure (tau), unless forced.

Registration is all or nothing: a version counts once its last call tagged it `ppdkit.registered`;
one that a failure (or a stopped server, or a killed job) left without that tag is removed, at once
when possible, else by the next registration of the same run. A `models:/` URI resolves to a local
copy that has passed `read_component`'s checks (every file's sha256 and size, finite tensors).
"""

import hashlib
import logging
import re
import shutil
import tempfile
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from ppdkit.models.artifact import ArtifactError, read_component
from ppdkit.models.paths import atomic_dir_swap, cache_dir

from .tracking import bound_http_retries, default_tracking_uri, server_call

log = logging.getLogger(__name__)

URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")
QUALITY_TAG = "tau"  # expected tokens per decoding step of the chosen tree, from calibration
COMPLETE_TAG = "ppdkit.registered"  # set by the last call of a registration: the version is whole


class RegistryError(ValueError):
    pass


def client(uri: str | None = None) -> MlflowClient:
    bound_http_retries()
    return MlflowClient(tracking_uri=uri or default_tracking_uri(), registry_uri=uri or default_tracking_uri())


def register_component(mlflow: MlflowClient, name: str, run_id: str, tags: dict[str, str],
                       artifact: str = "component") -> str:
    """A new version of `name` from the run's `artifact` (the pyfunc model around the component, or the bare
    `component`), tagged, aliased `challenger`.

    Registering the same run again with the same tags returns its version instead of adding one, so a
    job that died after registering (before its stage summary) registers exactly once when rerun.
    """
    bound_http_retries()
    uri = mlflow.tracking_uri
    tags = {k: str(v) for k, v in tags.items()}
    try:
        server_call(uri, "reading the registered model", mlflow.get_registered_model, name)
    except MlflowException:
        server_call(uri, "creating the registered model", mlflow.create_registered_model, name,
                    description="draft components (prompt tokens, heads, layer-skip drafts) trained by ppdkit, "
                                "for its lossless decoder")
    for old in server_call(uri, "listing the run's versions", mlflow.search_model_versions,
                           f"name='{name}' and run_id='{run_id}'"):
        if old.tags.get(COMPLETE_TAG) != "true":
            log.warning("removing %s version %s: an interrupted registration left it incomplete", name, old.version)
            server_call(uri, "removing an incomplete version", mlflow.delete_model_version, name, old.version)
        elif all(old.tags.get(k) == v for k, v in tags.items()):
            log.info("%s version %s already registers run %s", name, old.version, run_id)
            return str(old.version)
    previous = _alias_target(mlflow, name, "challenger")
    source = f"{server_call(uri, 'reading the run', mlflow.get_run, run_id).info.artifact_uri}/{artifact}"
    version = server_call(uri, "creating the model version", mlflow.create_model_version, name, source=source,
                          run_id=run_id, tags=tags).version
    try:
        server_call(uri, "setting the challenger alias", mlflow.set_registered_model_alias, name, "challenger", version)
        server_call(uri, "marking the version complete", mlflow.set_model_version_tag, name, version, COMPLETE_TAG, "true")
    except Exception as e:
        _undo_registration(mlflow, name, version, previous, e)
        raise
    log.debug("registered %s version %s (alias challenger)", name, version)  # the register stage's done line says it
    return str(version)


def _alias_target(mlflow: MlflowClient, name: str, alias: str) -> str | None:
    try:
        return str(server_call(mlflow.tracking_uri, f"reading the {alias} alias", mlflow.get_model_version_by_alias,
                               name, alias).version)
    except MlflowException:  # no such alias yet
        return None


def _undo_registration(mlflow: MlflowClient, name: str, version: str, previous: str | None, error: Exception) -> None:
    """Remove a version whose registration failed after it was created (its aliases go with it) and
    give `challenger` back to the version that held it; if that fails too, say what is left."""
    try:
        mlflow.delete_model_version(name, version)
        if previous is not None:
            mlflow.set_registered_model_alias(name, "challenger", previous)
    except Exception as undo_error:  # most likely the same stopped server
        raise RegistryError(
            f"{error} (registering {name} version {version} failed before it was complete, and undoing it failed "
            f"too: {undo_error.__class__.__name__}; a version left without the {COMPLETE_TAG} tag is removed, and "
            "the run registered again, by rerunning the same command)") from error
    log.warning("registering %s version %s failed before it was complete; the version was removed", name, version)


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
    """models:/NAME@ALIAS or models:/NAME/VERSION -> a local component directory that passed its checks.

    The download goes to a temporary directory, is checked with `read_component`, and only then is
    renamed into the cache. A cached copy that fails the checks is downloaded once more.
    """
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
    # keyed by the source too: another registry (a local store, a server) may have its own NAME version 1
    source_key = hashlib.sha256(version.source.encode()).hexdigest()[:12]
    target = cache_dir() / "registry" / name / f"{version.version}-{source_key}"
    if target.exists():
        try:
            component = _component_in(target)
            read_component(component)
            return component
        except ArtifactError as e:
            log.warning("the cached copy of %s is damaged (%s); downloading it again", uri, e)
            shutil.rmtree(target)
    fresh = _download(mlflow, version.source, target.parent)
    try:
        read_component(_component_in(fresh))
    except ArtifactError as e:
        shutil.rmtree(fresh, ignore_errors=True)
        raise RegistryError(f"{uri} ({name} version {version.version}) is damaged in the registry: a fresh download "
                            f"from {version.source} fails its checks too ({e}). Register the component again "
                            "(rerun the job's register stage with --force) or use another version") from None
    atomic_dir_swap(fresh, target)
    return _component_in(target)


def _component_in(downloaded: Path) -> Path:
    """The component directory of a downloaded version: inside its pyfunc model, or the bare component."""
    wrapped = sorted((downloaded / "model" / "data").glob("*/component.json"))  # registry/pyfunc.py's data
    return wrapped[0].parent if wrapped else downloaded / "component"


def _download(mlflow: MlflowClient, source: str, parent: Path) -> Path:
    """The artifact at `source` downloaded into a new temporary directory under `parent` (same file
    system as the cache, so publishing it is one rename)."""
    import mlflow as mlflow_module

    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=parent))
    try:
        mlflow_module.artifacts.download_artifacts(artifact_uri=source, dst_path=str(tmp),
                                                   tracking_uri=mlflow.tracking_uri)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp
