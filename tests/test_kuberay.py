"""The KubeRay manifests (infra/kuberay): exactly what `ppdkit kuberay` renders from the committed recipe, with the
entrypoint, variables, Ray version and stage sizes `ppdkit submit` and the image use.

No installable package ships KubeRay's CRD schema (RayCluster, RayJob; docs/clusters.md#kuberay says where it was
looked for), so the Ray fields are checked here by what they must hold; the pod templates, Kubernetes' own
PodTemplateSpec inside the CRD, are validated against Kubernetes' strict schema (the kubernetes-validate package)."""

import math
import re
import shlex
from pathlib import PurePosixPath
from types import SimpleNamespace

import kubernetes_validate
import pytest
import yaml
from conftest import REPO

from ppdkit.cli.main import main
from ppdkit.jobs import submit as ray_jobs
from ppdkit.jobs.kuberay import DATA_CHECK_CPUS, KubeRaySettings, job_env, rayjob, worker_cpus
from ppdkit.jobs.spec import load_spec

KUBERAY = REPO / "infra" / "kuberay"
FILES = ("raycluster.yaml", "rayjob.yaml")
COMMAND_LINE = "#   ppdkit kuberay "


def _manifest(name: str) -> dict:
    return yaml.safe_load((KUBERAY / name).read_text())


def _command(name: str) -> list[str]:
    """The header's command, as argv for `ppdkit`."""
    line = next(line for line in (KUBERAY / name).read_text().splitlines() if line.startswith(COMMAND_LINE))
    return shlex.split(line.removeprefix("#   ppdkit "))


def _groups(manifest: dict) -> list[dict]:
    cluster = manifest["spec"].get("rayClusterSpec", manifest["spec"])
    return [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]


def _recipe():
    """The spec and settings the committed files were made from (the header's command: spec, overrides, options)."""
    argv = _command("rayjob.yaml")[1:]
    spec_file = argv[0]
    overrides = [a for a in argv[1:] if "=" in a and not a.startswith("--")]
    options = dict(zip(argv[1:][len(overrides)::2], argv[1:][len(overrides) + 1::2]))
    settings = KubeRaySettings(**{k.removeprefix("--").replace("-", "_"): v for k, v in options.items()})
    return load_spec(REPO / spec_file, overrides), PurePosixPath(spec_file), overrides, settings


def test_committed_manifests_are_what_the_command_in_their_header_renders(tmp_path, monkeypatch):
    argv = _command("raycluster.yaml")
    assert argv == _command("rayjob.yaml")
    monkeypatch.chdir(REPO)  # the header names the spec from the repository root
    assert main(argv + ["--out-dir", str(tmp_path)]) == 0
    for name in FILES:
        assert (tmp_path / name).read_text() == (KUBERAY / name).read_text(), \
            f"infra/kuberay/{name} differs from what `ppdkit {shlex.join(argv)}` renders now: run it"


def test_kinds_ray_version_and_the_image_pin():
    import ray

    cluster, job = _manifest("raycluster.yaml"), _manifest("rayjob.yaml")
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert cluster["spec"]["rayVersion"] == ray.__version__
    assert job["spec"]["rayClusterSpec"] == cluster["spec"]  # the RayJob's own cluster has the RayCluster's shape
    pinned = re.search(r'"ray\[[^]]*\]==([^"]+)"', (REPO / "infra" / "image" / "Dockerfile").read_text())
    assert pinned and pinned.group(1) == ray.__version__, "the image must carry the Ray the manifests name"
    for manifest in (cluster, job):
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", manifest["metadata"]["name"])


def test_every_pod_has_the_image_the_shared_volume_and_the_job_variables():
    *_, settings = _recipe()
    for name in FILES:
        for group in _groups(_manifest(name)):
            pod = group["template"]["spec"]
            volumes = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
            for container in pod["containers"]:
                assert container["image"] == settings.image
                mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
                assert mounts[settings.mount] == settings.claim
                env = {e["name"]: e["value"] for e in container["env"]}
                assert env == job_env(settings)
                assert PurePosixPath(env["PPDKIT_CACHE"]).is_relative_to(settings.mount)
            # KubeRay's CRD types rayStartParams as map[string]string
            assert all(isinstance(v, str) for v in group["rayStartParams"].values())
        head = _groups(_manifest(name))[0]
        assert head["rayStartParams"]["num-cpus"] == "0"  # the head schedules; the stages run on the workers


@pytest.mark.parametrize("name", FILES)
def test_pod_templates_pass_kubernetes_strict_schema(name):
    for group in _groups(_manifest(name)):
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": group["template"]}
        kubernetes_validate.validate(template, kubernetes_validate.latest_version(), strict=True)
    misspelt = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                "template": {"spec": {"containers": [{"name": "c", "image": "i", "volumeMount": []}]}}}
    with pytest.raises(kubernetes_validate.ValidationError):  # strict: an unknown key fails, as the API server's would
        kubernetes_validate.validate(misspelt, kubernetes_validate.latest_version(), strict=True)


class _Jobs:
    """A job API that records what it is sent."""
    def __init__(self):
        self.sent = {}

    def submit_job(self, **kwargs):
        self.sent = kwargs
        return kwargs["submission_id"]


def test_the_entrypoint_is_submits_with_the_spec_the_image_holds(monkeypatch):
    spec, spec_file, overrides, settings = _recipe()
    jobs = _Jobs()
    monkeypatch.setattr(ray_jobs, "client", lambda address: jobs)
    output = f"{settings.mount}/ppdkit/runs/{spec.name}"
    ray_jobs.submit(spec, "http://10.0.0.7:8265", output, None, {})  # a remote head: its `python`
    in_image = str(PurePosixPath(settings.image_root) / spec_file)
    entry = _manifest("rayjob.yaml")["spec"]["entrypoint"]
    assert entry == jobs.sent["entrypoint"].replace("job.yaml", shlex.join([in_image, *overrides]))
    assert (REPO / spec_file).is_file()  # the image copies the repository, so the pods hold this file


def test_overrides_reach_the_job_quoted_for_its_shell():
    spec, spec_file, _, settings = _recipe()
    overrides = ["evaluate.methods=[ar, ppd]", "data.limit=64"]
    entry = rayjob(spec, spec_file, overrides, settings, "2.0.0")["spec"]["entrypoint"]
    argv = shlex.split(entry)
    in_image = str(PurePosixPath(settings.image_root) / spec_file)
    assert argv[argv.index("run") + 1:argv.index("--output")] == [in_image, *overrides]


def test_the_job_variables_are_submits_less_the_auth_mode(monkeypatch):
    from ppdkit.cli import service_commands

    class Everything(dict):  # an environment holding every variable: submit passes all it looks for
        def __contains__(self, key):
            return True

        def __getitem__(self, key):
            return f"<{key}>"

    sent = {}
    monkeypatch.setattr(service_commands, "os", SimpleNamespace(environ=Everything()))
    monkeypatch.setattr(ray_jobs, "submit", lambda spec, address, output, python, env: sent.update(env) or "id")
    args = SimpleNamespace(spec=str(REPO / "ppdkit/jobs/configs/smollm2-ppd.yaml"), overrides=[], address="x",
                           output=None, python=None, wait=False)
    service_commands.cmd_submit(args)
    # RAY_AUTH_MODE matches a client to a local head's token mode; on Kubernetes KubeRay starts Ray and submits
    assert set(sent) == set(job_env(KubeRaySettings())) | {"RAY_AUTH_MODE"}


def _fits(pod_cpus: int, pods: int, actors: int, cpus: int) -> bool:
    """Whether `actors` of `cpus` CPUs each can be placed on `pods` pods of `pod_cpus` (none split between pods)."""
    return pods * (pod_cpus // cpus) >= actors


def test_worker_pods_hold_every_stage_of_the_spec():
    spec, *_, settings = _recipe()
    worker = _groups(_manifest("raycluster.yaml"))[1]
    pod_cpus, pods = int(worker["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]), worker["replicas"]
    assert _fits(pod_cpus, pods, spec.teacher.workers, spec.teacher.cpus_per_worker)
    assert _fits(pod_cpus, pods, spec.train.num_workers, spec.train.cpus_per_worker)
    assert min(DATA_CHECK_CPUS, pod_cpus * pods) <= pod_cpus  # the data check's one task


@pytest.mark.parametrize("teacher, train, method, replicas, expected", [
    ((3, 2), (2, 1), "ept", 2, 4),  # 3 actors of 2 on 2 pods: 4 a pod (6 / 2 = 3 would leave one unplaced)
    ((2, 1), (4, 3), "ept", 2, 6),
    ((2, 1), (4, 3), "layer-skip", 2, 12),  # a trial is one task of all the training CPUs
    ((1, 1), (1, 1), "ept", 1, 1),  # one pod: the data check asks for no more than it has
    ((1, 1), (1, 1), "ept", 3, DATA_CHECK_CPUS),
])
def test_worker_cpus(teacher, train, method, replicas, expected):
    spec = SimpleNamespace(teacher=SimpleNamespace(workers=teacher[0], cpus_per_worker=teacher[1]),
                           train=SimpleNamespace(num_workers=train[0], cpus_per_worker=train[1], method=method),
                           data=SimpleNamespace(check_sequences=8))
    cpus = worker_cpus(spec, replicas)
    assert cpus == expected
    ranks = train[0] if method == "layer-skip" else math.ceil(train[0] / replicas)
    assert _fits(cpus, replicas, *teacher) and ranks * train[1] <= cpus


def test_settings_are_checked():
    with pytest.raises(ValueError, match="replicas"):
        KubeRaySettings(replicas=9, max_replicas=8)
    with pytest.raises(ValueError, match="Extra inputs"):
        KubeRaySettings(imag="x")
    with pytest.raises(ValueError, match="absolute"):
        KubeRaySettings(mount="cache")


def test_a_spec_outside_the_repository_is_refused(tmp_path, capsys):
    outside = tmp_path / "job.yaml"
    outside.write_text((REPO / "ppdkit/jobs/configs/smollm2-ppd.yaml").read_text())
    argv = ["kuberay", str(outside), "--out-dir", str(tmp_path / "out")]
    assert main(argv) == 2
    assert "outside" in capsys.readouterr().err and not (tmp_path / "out").exists()
