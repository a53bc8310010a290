"""The installed layout: everything under `ppdkit.`, nothing that shadows PyPI's top-level packages."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO, free_port

FOLDERS = ("models", "data_pipeline", "trainer", "runtime", "registry", "jobs", "bench", "serving", "cli")


def _python(code: str, cwd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *kw.get("flags", []), "-c", code], cwd=cwd, capture_output=True,
                          text=True, env=kw.get("env"), timeout=300)


def test_namespaced_imports_work_from_anywhere(tmp_path):
    result = _python("import ppdkit.trainer, ppdkit.runtime, ppdkit.cli.main; print(ppdkit.trainer.__name__)", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ppdkit.trainer"


def test_top_level_trainer_is_never_ppdkit_code(tmp_path):
    # The packages live in ppdkit/, so neither the repo root nor anywhere else exposes one as `trainer`: that name is
    # whatever PyPI installed (or nothing), never our folder.
    for cwd in (REPO, tmp_path):
        found = _python("import trainer, os; print(os.path.abspath(trainer.__file__))", cwd)
        assert found.returncode != 0 or str(REPO) not in found.stdout


def test_wheel_installs_everything_under_the_namespace(tmp_path):
    shutil.rmtree(REPO / "build", ignore_errors=True)  # an earlier build's files would fill in what pyproject omits
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "wheel"), str(REPO)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "wheel").glob("ppdkit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"ppdkit"}
    for folder in FOLDERS:
        assert f"ppdkit/{folder}/__init__.py" in names
    sources = {str(p.relative_to(REPO)) for p in (REPO / "ppdkit").rglob("*.py")}  # sub-packages too (runtime's rooms)
    assert not sources - set(names), f"not in the wheel (pyproject's packages): {sorted(sources - set(names))}"
    assert {n for n in names if n.startswith("ppdkit/runtime/kernels/") and n.endswith(".cpp")}, "no kernel sources"
    assert "ppdkit/jobs/configs/demo.yaml" in names
    # The plain (non-editable) install: unpack the wheel and import from it, with site's .pth files off
    # so the editable install of this checkout cannot answer instead.
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    env = {"PYTHONPATH": f"{target}:{site_packages}", "PATH": "/usr/bin:/bin"}
    result = _python("import ppdkit.trainer, ppdkit.runtime, ppdkit.cli.main, ppdkit.cli.job_commands as c; "
                     "print(ppdkit.trainer.__file__); print(c.demo_spec_path().is_file())", tmp_path, flags=["-S"],
                     env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(target / "ppdkit" / "trainer" / "__init__.py"), "True"]


def test_console_command_lists_its_subcommands():
    ppdkit = Path(sys.executable).with_name("ppdkit")  # the console script of the venv running the tests
    result = subprocess.run([str(ppdkit), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for command in ("run", "demo", "ui"):
        assert command in result.stdout


def test_ui_runs_mlflow_from_its_own_environment_without_an_activated_venv(tmp_path):
    """`.venv/bin/ppdkit ui` with no venv on PATH: mlflow comes from the interpreter ppdkit runs in."""
    import os
    import time
    import urllib.request

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "MLFLOW_TRACKING_URI")}
    env["PATH"] = "/usr/bin:/bin"  # no mlflow here
    ppdkit = Path(sys.executable).with_name("ppdkit")
    server = subprocess.Popen([str(ppdkit), "ui", "--port", str(port), "--tracking-uri",
                               f"sqlite:///{tmp_path / 'mlflow.db'}"], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
                    assert reply.status == 200
                    break
            except OSError:
                assert server.poll() is None, server.stdout.read()
                assert time.time() < deadline, "the MLflow UI did not answer within 2 minutes"
                time.sleep(1)
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_other_libraries_bars_stay_off_unless_verbose(tmp_path):
    run = [sys.executable, "-m", "ppdkit.cli.main", "decode", "--base", "tiny-llama", "--method", "ar", "--prompt",
           "hi", "--max-new-tokens", "4"]
    # as a user's shell has it: not the switches an in-process `ppdkit` call of another test left in os.environ
    env = {k: v for k, v in os.environ.items() if not k.endswith("DISABLE_PROGRESS_BARS")}
    quiet = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert quiet.returncode == 0 and "[ar] 4 tokens" in quiet.stderr and "Loading weights" not in quiet.stderr
    loud = subprocess.run(run[:3] + ["--verbose"] + run[3:], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300, env=env)
    assert loud.returncode == 0 and "Loading weights" in loud.stderr
