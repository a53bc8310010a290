"""The native kernels build once per machine and environment: not again when another ninja comes first on PATH (a
shell without the venv activated finds the system's) or when the package lives elsewhere (a job's copy of it on a
Ray cluster). Each of those used to rebuild everything, 1.5 minutes on 2 cores."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from ppdkit.runtime.kernels.native import cpu_supports_kernels, kernels_build_dir

# native.py loaded from the file given, as a module of its own: a copy of runtime/kernels/ finds its sources beside it
LOAD = """import importlib.util, sys
spec = importlib.util.spec_from_file_location("native_copy", sys.argv[1])
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)
assert native.native_kernels() is not None, "the kernels did not build"
"""

pytestmark = [pytest.mark.integration,  # builds in processes of their own (make test-fast leaves them out)
              pytest.mark.skipif(not cpu_supports_kernels() or shutil.which("c++") is None,
                                 reason="the native kernels need AVX-512 or AVX2 and a C++ compiler")]


def _load(native_py, path_variable: str) -> None:
    env = {**os.environ, "PATH": path_variable, "PPDKIT_NATIVE_KERNELS": "1"}
    done = subprocess.run([sys.executable, "-c", LOAD, str(native_py)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def test_kernels_are_not_rebuilt_for_another_ninja_or_another_copy_of_the_package(tmp_path):
    scripts = os.path.dirname(sys.executable)
    bare_path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if os.path.abspath(p) != scripts)
    native_py = REPO / "ppdkit" / "runtime" / "kernels" / "native.py"
    _load(native_py, bare_path)  # built here unless an earlier test built them
    build = kernels_build_dir()
    library, log = next(build.glob("*.so")), build / ".ninja_log"
    before = library.stat().st_mtime_ns, log.read_text()

    copy = tmp_path / "elsewhere" / "kernels"  # newer files at another path, as Ray unpacks a job's package
    shutil.copytree(native_py.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for loaded, path_variable in [(native_py, f"{scripts}{os.pathsep}{bare_path}"), (native_py, bare_path),
                                  (copy / "native.py", bare_path)]:
        _load(loaded, path_variable)
        assert (library.stat().st_mtime_ns, log.read_text()) == before, \
            f"the kernels were built again for {loaded} with PATH={path_variable}"
