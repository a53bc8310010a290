"""KubeRay manifests (a RayCluster and a RayJob, apiVersion ray.io/v1) rendered from a job spec: `ppdkit kuberay`.

Pure functions of the spec, the cluster settings below and the Ray version. What `ppdkit submit` decides comes from
the same code: the entrypoint (jobs/submit.py `entrypoint`), the variables it passes the job, and the stage sizes
the spec asks Ray for; so a manifest cannot ask for a job the CLI would not run.
"""

import math
import re
import textwrap
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import Field, model_validator

from ppdkit.models.config import Section

if TYPE_CHECKING:  # `ppdkit`'s parser builds its options from KubeRaySettings: the spec's imports wait for a run
    from .spec import JobSpec

API_VERSION = "ray.io/v1"
WORKER_GROUP = "cpu"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class KubeRaySettings(Section):
    """What the spec does not say about a Kubernetes cluster. Each key is a `ppdkit kuberay` option (--image, ...)."""
    name: str = Field("ppdkit", description="the RayCluster's name (KubeRay's head service is <name>-head-svc)")
    image: str = Field("ppdkit:latest", min_length=1, description="every pod's image (infra/image/Dockerfile)")
    image_root: str = Field("/opt/ppdkit", description="where the image holds the repository (the Dockerfile's "
                                                       "WORKDIR): the job reads its spec from there")
    mlflow_uri: str = Field("http://mlflow.ppdkit.svc:5000", min_length=1,
                            description="MLFLOW_TRACKING_URI of every pod")
    claim: str = Field("ppdkit-cache", min_length=1, description="the PersistentVolumeClaim every pod mounts")
    mount: str = Field("/cache", description="where it is mounted; PPDKIT_CACHE and the job's output lie on it")
    replicas: int = Field(2, ge=1, description="worker pods (the stages' actors and ranks are spread over them)")
    min_replicas: int = Field(1, ge=0, description="the worker group's minReplicas (for an autoscaler)")
    max_replicas: int = Field(8, ge=1, description="the worker group's maxReplicas (for an autoscaler)")
    head_cpus: int = Field(2, ge=1, description="the head pod's CPU limit (it schedules only: Ray gets 0 of them)")
    head_memory: str = Field("8Gi", min_length=1, description="the head pod's memory limit")
    worker_memory: str = Field("16Gi", min_length=1, description="each worker pod's memory limit")
    ttl_s: int = Field(3600, ge=0, description="the RayJob's cluster is removed this long after the job ends")

    @model_validator(mode="after")
    def _replicas_within_bounds(self) -> "KubeRaySettings":
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError(f"replicas {self.replicas} must lie within min_replicas {self.min_replicas} and "
                             f"max_replicas {self.max_replicas}")
        if not _DNS_LABEL.fullmatch(self.name):
            raise ValueError(f"name {self.name!r} is not a Kubernetes name (lowercase letters, digits, '-')")
        for key in ("mount", "image_root"):
            if not PurePosixPath(getattr(self, key)).is_absolute():
                raise ValueError(f"{key} {getattr(self, key)!r} must be an absolute path in the pod")
        return self


# The data stage's check scores on one Ray task of min(4, the cluster's CPUs) (data_pipeline/data_stage.py): a sum
# over pods, so with two or more pods one pod must hold 4, or the task never schedules.
DATA_CHECK_CPUS = 4


def worker_cpus(spec: "JobSpec", replicas: int) -> int:
    """CPUs of one worker pod such that each of the spec's stages fits on `replicas` pods. A stage's actors (or
    ranks) spread evenly, so the fullest pod holds ceil(n / replicas) of them, each wanting cpus_per_worker: an
    actor's CPUs cannot be split between pods, so total CPUs / replicas would undersize (3 actors of 2 on 2 pods need
    4 a pod, not 3). Layer-skip times each trial on one task of all the training CPUs, so one pod holds them all.
    KubeRay gives Ray the container's CPU limit, so the limit is what Ray schedules with."""
    one_task = spec.train.method == "layer-skip"
    train = (spec.train.num_workers if one_task else math.ceil(spec.train.num_workers / replicas)) \
        * spec.train.cpus_per_worker
    teacher = math.ceil(spec.teacher.workers / replicas) * spec.teacher.cpus_per_worker
    check = DATA_CHECK_CPUS if spec.data.check_sequences and replicas > 1 else 1
    return max(train, teacher, check)


def cache_dir(settings: KubeRaySettings) -> str:
    """PPDKIT_CACHE on the shared volume: converted models and the teacher cache, seen by every pod."""
    return str(PurePosixPath(settings.mount) / "ppdkit")


def output_dir(spec: "JobSpec", settings: KubeRaySettings) -> str:
    """The job's output on the shared volume: Ray Train's storage and every rank's checkpoints must be where every
    node sees them (trainer/launch.py)."""
    return str(PurePosixPath(cache_dir(settings)) / "runs" / spec.name)


def job_env(settings: KubeRaySettings) -> dict[str, str]:
    """What `ppdkit submit` passes a job from its shell (cli/service_commands.py), set for the pods instead. Not
    RAY_AUTH_MODE: that matches a client to a local head's token mode, and here KubeRay starts Ray and submits."""
    return {"MLFLOW_TRACKING_URI": settings.mlflow_uri, "PPDKIT_CACHE": cache_dir(settings)}


def spec_in_image(spec_file: PurePosixPath, settings: KubeRaySettings) -> str:
    """Where the pods find the spec: `spec_file` is relative to the repository the image copied."""
    if spec_file.is_absolute() or ".." in spec_file.parts:
        raise ValueError(f"spec {spec_file} must be a path inside the repository the image is built from")
    return str(PurePosixPath(settings.image_root) / spec_file)


def _pod(role: str, settings: KubeRaySettings, cpus: int, memory: str) -> dict[str, Any]:
    container = {
        "name": f"ray-{role}",
        "image": settings.image,
        "resources": {"limits": {"cpu": str(cpus), "memory": memory}},
        "env": [{"name": k, "value": v} for k, v in job_env(settings).items()],
        "volumeMounts": [{"name": "cache", "mountPath": settings.mount}],
    }
    volume = {"name": "cache", "persistentVolumeClaim": {"claimName": settings.claim}}
    return {"spec": {"containers": [container], "volumes": [volume]}}


def cluster_spec(spec: "JobSpec", settings: KubeRaySettings, ray_version: str) -> dict[str, Any]:
    """The RayCluster's spec, the same in the RayJob (its own cluster of this shape)."""
    return {
        "rayVersion": ray_version,  # the image must carry this Ray (infra/image/Dockerfile pins it)
        "headGroupSpec": {
            # num-cpus 0: the head schedules and runs the job's driver; the stages' actors and ranks go to workers.
            # The dashboard listens in the pod network only; expose it with a Service you control.
            "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
            "template": _pod("head", settings, settings.head_cpus, settings.head_memory),
        },
        "workerGroupSpecs": [{
            "groupName": WORKER_GROUP,
            "replicas": settings.replicas,
            "minReplicas": settings.min_replicas,
            "maxReplicas": settings.max_replicas,
            "rayStartParams": {},
            "template": _pod("worker", settings, worker_cpus(spec, settings.replicas), settings.worker_memory),
        }],
    }


def raycluster(spec: "JobSpec", settings: KubeRaySettings, ray_version: str) -> dict[str, Any]:
    """A long-lived cluster to `ppdkit submit` jobs to."""
    return {"apiVersion": API_VERSION, "kind": "RayCluster", "metadata": {"name": settings.name},
            "spec": cluster_spec(spec, settings, ray_version)}


def rayjob(spec: "JobSpec", spec_file: PurePosixPath, overrides: list[str], settings: KubeRaySettings,
           ray_version: str) -> dict[str, Any]:
    """The spec's whole pipeline as a RayJob on a cluster of its own, removed `ttl_s` after the job ends. The job
    runs the spec file the image holds with the same overrides, so it loads the spec this was rendered from. No
    ray.address: Ray gives a job's driver its cluster's address (RAY_ADDRESS), as for `ppdkit submit`."""
    from .submit import entrypoint  # here: submit imports the spec (see TYPE_CHECKING above)

    name = re.sub(r"[^a-z0-9-]+", "-", f"{settings.name}-{spec.name}".lower()).strip("-")
    return {
        "apiVersion": API_VERSION, "kind": "RayJob", "metadata": {"name": name},
        "spec": {
            "entrypoint": entrypoint(spec_in_image(spec_file, settings), output_dir(spec, settings),
                                     overrides=overrides),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": settings.ttl_s,
            "rayClusterSpec": cluster_spec(spec, settings, ray_version),
        },
    }


GENERATED_BY = ("# Generated (ppdkit/jobs/kuberay.py) from the job spec and the installed Ray, not written by "
                "hand; to make it again:\n#   ")


def manifest_text(manifest: dict[str, Any], what: str, command: str) -> str:
    """The YAML file: a header saying what it is and the command that made it (on a line of its own, to be run
    again), then the manifest."""
    lines = textwrap.wrap(what, width=118, break_long_words=False, break_on_hyphens=False)
    header = "".join(f"# {line}\n" for line in lines) + GENERATED_BY + command + "\n"
    return header + yaml.safe_dump(manifest, sort_keys=False, width=100)
