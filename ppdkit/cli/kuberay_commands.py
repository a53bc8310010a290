"""`ppdkit kuberay`: a job spec's KubeRay manifests (raycluster.yaml, rayjob.yaml), rendered by jobs/kuberay.py from
the spec and the settings `ppdkit submit` uses; infra/kuberay holds those of the smollm2-ppd recipe."""

import argparse
import shlex
from pathlib import Path, PurePosixPath

OUT_DIR = "infra/kuberay"


def _option(key: str) -> str:
    return "--" + key.replace("_", "-")


def _repository() -> Path:
    """The folder the image copies (its build context): the one holding the `ppdkit` package."""
    import ppdkit

    return Path(ppdkit.__file__).resolve().parent.parent


def render(args: argparse.Namespace) -> dict[str, str]:
    """{file name: its text}: the two manifests, each headed by the command that makes them again."""
    from importlib.metadata import version

    from pydantic import ValidationError

    from ppdkit.jobs.kuberay import KubeRaySettings, raycluster, rayjob, manifest_text
    from ppdkit.jobs.spec import SpecError, load_spec

    spec = load_spec(args.spec, args.overrides)  # a bad spec fails here, as `ppdkit submit` fails it
    given = {key: getattr(args, key) for key in KubeRaySettings.model_fields if getattr(args, key) is not None}
    try:
        settings = KubeRaySettings(**given)
    except ValidationError as e:  # one line a problem, named by its option
        problems = (f"{' '.join(_option(str(k)) for k in x['loc'])} {x['msg'].removeprefix('Value error, ')}".strip()
                    for x in e.errors())
        raise SpecError("kuberay options: " + "; ".join(problems)) from None
    try:
        spec_file = PurePosixPath(Path(args.spec).resolve().relative_to(_repository()).as_posix())
    except ValueError:
        raise SpecError(f"job spec {args.spec} is outside {_repository()}, which the image copies: the pods would not "
                        "find it. Put it in the repository and build the image again") from None
    # the header names the spec from the repository root and only the options given, so it reads the same wherever
    # it was run from and the test can run it again
    command = shlex.join(["ppdkit", "kuberay", str(spec_file), *args.overrides,
                          *(part for key, value in given.items() for part in (_option(key), str(value)))])
    ray_version = version("ray")  # the installed Ray's, what `ppdkit submit` and `ppdkit run` use
    cluster = raycluster(spec, settings, ray_version)
    job = rayjob(spec, spec_file, list(args.overrides), settings, ray_version)
    return {
        "raycluster.yaml": manifest_text(cluster, "A RayCluster for ppdkit jobs (`ppdkit submit`): a head that only "
                                         "schedules, CPU workers sized so each of the spec's stages fits; "
                                         "PPDKIT_CACHE and the job's output on a volume every pod mounts.", command),
        "rayjob.yaml": manifest_text(job, f"The {spec.name} pipeline as a RayJob on a cluster of its own (the "
                                     f"RayCluster's spec), removed {settings.ttl_s} s after it ends.", command),
    }


def cmd_kuberay(args: argparse.Namespace) -> int:
    files = render(args)  # a refused spec or setting writes nothing
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
        print(out / name)
    return 0


def add_kuberay_commands(sub: argparse._SubParsersAction) -> None:
    from ppdkit.jobs.kuberay import KubeRaySettings

    kuberay = sub.add_parser("kuberay", help="write a job spec's KubeRay RayCluster and RayJob manifests")
    kuberay.add_argument("spec", help="a job spec inside the repository the image is built from")
    kuberay.add_argument("overrides", nargs="*", metavar="key=value")
    for key, field in KubeRaySettings.model_fields.items():
        kuberay.add_argument(_option(key), dest=key, help=f"{field.description} (default: {field.default})")
    kuberay.add_argument("--out-dir", default=OUT_DIR, help=f"where the two files go (default: {OUT_DIR})")
    kuberay.set_defaults(func=cmd_kuberay)
