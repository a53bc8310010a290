"""llama.cpp as a baseline in `ppdkit bench` (llama-cpp-python, the optional extra `ppdkit[llama]`).

The comparison users make: the same base model, the same prompt token ids (ppdkit's chat template), greedy, the
same threads. Five methods:
- `llama.cpp`: plain decoding of a GGUF at the runtime's precision (bf16 or f32), written once into the cache from
  the base model's own GGUF (SmolLM2's Q4_1 from its package: its metadata and tokenizer, its tensors de-quantized,
  which are exactly the weights ppdkit's runtime holds); with the runtime on `gguf`, that file itself;
- `llama.cpp-lookup`: the same file with llama.cpp's prompt-lookup speculative decoding;
- `llama.cpp-q4`: the package's Q4_1 file itself, plain: the bar for a 4-bit runtime;
- `llama.cpp-eagle3`: that Q4_1 file with ppdkit's EAGLE-3 draft (the component benched where it is one, else the
  committed one), exported as `ppdkit export --format gguf` does, run by llama.cpp's own `llama-server` (`make
  setup-llama-server`; the Python binding has no EAGLE-3 drafting), one slot, greedy, token ids in and out; its tokens
  per step from the server's own count of drafted tokens it kept;
- `llama.cpp-server`: the same llama-server without the draft, what llama.cpp-eagle3's answers are held to (the
  binding's build rounds otherwise: none of 3 MT-Bench answers matched token for token).
llama.cpp's speculative outputs are compared with its own plain decoding of the same file, not with ppdkit's: its
kernels round differently, and it makes no promise that drafting leaves them unchanged.
"""

import importlib.util
import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from ppdkit.models.paths import cache_dir
from ppdkit.runtime.forward.dtypes import BLOCK_FORMATS

log = logging.getLogger(__name__)

LLAMA_METHODS = ("llama.cpp", "llama.cpp-lookup", "llama.cpp-q4", "llama.cpp-server", "llama.cpp-eagle3")
SERVER_METHODS = ("llama.cpp-server", "llama.cpp-eagle3")  # run by llama-server, not the binding
# what each speculative method's output is held to: llama.cpp's plain decoding of the same file by the same build
LLAMA_PLAIN = {"llama.cpp-lookup": "llama.cpp", "llama.cpp-eagle3": "llama.cpp-server"}
SERVER_START_SECONDS = 300  # a first start exports the draft (the converter: about a minute on 2 cores)
INSTALL_HINT = 'pip install "ppdkit[llama]"   (llama-cpp-python, built for this CPU: a few minutes)'
LOOKUP_TOKENS = 10  # drafted tokens per step, as transformers' prompt lookup in hf-pld
WORKER = Path(__file__).with_name("llama_cpp_worker.py")
# make setup-llama (infra/llama_cpp/install.sh) builds with --no-cache-dir: pip reuses a wheel it built before, whatever
# CMAKE_ARGS says (a cached GCC build with the AMX kernels, which crash on any prompt, ran on a CI machine)
REBUILD_HINT = "pip uninstall -y llama-cpp-python && make setup-llama"


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def widened_gguf(source: Path, dtype: str, out: Path | None = None) -> Path:
    """`source` rewritten with every quantized tensor de-quantized to `dtype` ("bfloat16" or "float32"), its metadata
    and tokenizer kept; written once (atomically) into the cache. "gguf" (the runtime on the file's own blocks) and
    "q4" (blocks quantized again from its de-quantized weights): `source` itself."""
    if dtype in BLOCK_FORMATS:
        return source
    import gguf

    kind = {"bfloat16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
            "float32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32)}[dtype]
    out = out or cache_dir() / "gguf" / f"{source.stem}-{dtype}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    log.info("writing %s for llama.cpp (once): %s with its tensors de-quantized", out.name, source.name)
    logging.getLogger("gguf").setLevel(logging.WARNING)  # its writer's lines are not for our console
    reader = gguf.GGUFReader(source)
    partial = out.with_suffix(".partial")
    writer = gguf.GGUFWriter(partial, arch=reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue  # the writer's own
        value = int(kind[1]) if field.name == "general.file_type" else field.contents()
        writer.add_key_value(field.name, value, field.types[0], field.types[1] if len(field.types) > 1 else None)
    for tensor in reader.tensors:
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if tensor.tensor_type == gguf.GGMLQuantizationType.F32:  # the norms stay float32, as the converter keeps them
            writer.add_tensor(tensor.name, weights)
            continue
        packed = gguf.quants.quantize(weights, kind[0])
        writer.add_tensor(tensor.name, packed, raw_shape=packed.shape if kind[0] == gguf.GGMLQuantizationType.F32
                          else gguf.quants.quant_shape_to_byte_shape(weights.shape, kind[0]), raw_dtype=kind[0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(out)
    return out


class LlamaCpp:
    """One GGUF loaded in llama.cpp, greedy, with `threads` threads; `lookup` adds its prompt-lookup drafting.

    llama.cpp runs in a process of its own (bench/llama_cpp_worker.py, which says why), driven over a pipe: a
    request costs well under a millisecond, against the second or so of the generation it asks for."""

    def __init__(self, path: Path, threads: int, lookup: bool = False, context: int = 2048):
        if not llama_cpp_available():
            raise ValueError(f"the llama.cpp baseline needs llama-cpp-python: {INSTALL_HINT}")
        self.path = path
        settings = {"path": str(path), "threads": threads, "context": context,
                    "lookup_tokens": LOOKUP_TOKENS if lookup else 0}
        self.process = subprocess.Popen([sys.executable, str(WORKER), json.dumps(settings)], text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        hello = self._reply("loading")
        self.eos, self.system = hello["eos"], hello["system"]
        self.steps = 0  # the last answer's decoding steps: one a token

    def _reply(self, doing: str) -> dict:
        line = self.process.stdout.readline()
        if line:
            return json.loads(line)
        code = self.process.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        raise RuntimeError(f"llama.cpp's process ended ({how}) while {doing} {self.path.name}; what it printed is "
                           f"above. If it crashed, rebuild llama-cpp-python for this CPU: {REBUILD_HINT}")

    def close(self) -> None:
        """End llama.cpp's process (it frees the model itself when its input ends)."""
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # it had ended
        self.process.wait(timeout=60)
        self.process.stdout.close()

    def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy new tokens after the prompt ids, up to max_new_tokens or the end token (kept, as ppdkit keeps it)."""
        try:
            self.process.stdin.write(json.dumps({"ids": ids, "max_new_tokens": max_new_tokens}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it has ended: _reply says how
        tokens = self._reply("generating with")["tokens"]
        self.steps = len(tokens)
        return tokens


class LlamaServer:
    """llama.cpp's `llama-server` on the base model's GGUF, with ppdkit's EAGLE-3 draft where `eagle3` (serve-bench's
    `llama.cpp` and `llama.cpp-eagle3` launches), asked for one answer at a time on /completion: the prompt as token
    ids, greedy, the new token ids back. The same interface as LlamaCpp."""

    def __init__(self, source: str, base_only: bool, threads: int, work: Path, max_new_tokens: int, eagle3: bool):
        """`source`: the bench's component (the draft where it is an eagle3 one, else the committed draft), or with
        `base_only` its base model."""
        from contextlib import ExitStack

        from .serving_backends import ServeBenchSettings, Unavailable, free_port, launch_llama_server, running

        settings = ServeBenchSettings(source=source, base_only=base_only, threads=threads, max_tokens=max_new_tokens,
                                      work=work)
        work.mkdir(parents=True, exist_ok=True)
        port = free_port()
        try:
            launch = launch_llama_server(settings, port, eagle3=eagle3)
        except Unavailable as error:
            raise ValueError(f"{'llama.cpp-eagle3' if eagle3 else 'llama.cpp-server'}: {error}") from None
        self.serves, self._stack = launch.serves, ExitStack()
        self.server = self._stack.enter_context(running(launch, port, work / f"{launch.kind}.log",
                                                        SERVER_START_SECONDS))
        self.steps = 0

    def close(self) -> None:
        self._stack.close()  # the server's process group, ended

    def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy new tokens after the prompt ids, up to max_new_tokens or the end token (kept, as LlamaCpp keeps it);
        self.steps: the target's forwards (a token each, plus the drafted tokens each kept)."""
        import urllib.request

        body = {"prompt": ids, "n_predict": max_new_tokens, "temperature": 0.0, "return_tokens": True,
                "cache_prompt": False}
        request = urllib.request.Request(self.server.url + "/completion", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            out = json.loads(response.read())
        tokens = out["tokens"]  # the end token among them, where it stopped there
        self.steps = len(tokens) - int(out.get("timings", {}).get("draft_n_accepted", 0))
        return tokens


def llama_runners(base: str, dtype: str, methods: list[str], threads: int, component: str | None = None,
                  max_new_tokens: int = 128) -> dict[str, "LlamaCpp | LlamaServer"]:
    """The llama.cpp runner of each llama.cpp method asked for; `component`: the bench's (llama.cpp-eagle3's draft
    where it is an eagle3 component)."""
    wanted = [m for m in methods if m in LLAMA_METHODS]
    if not wanted:
        return {}
    if set(wanted) - set(SERVER_METHODS) and not llama_cpp_available():  # llama-server needs no binding
        raise ValueError(f"{', '.join(wanted)} need llama-cpp-python: {INSTALL_HINT}")
    from ppdkit.models.catalog import base_gguf  # here: the command line's parsing stays free of torch

    source = base_gguf(base)
    same = widened_gguf(source, dtype) if {"llama.cpp", "llama.cpp-lookup"} & set(wanted) else None
    files = {"llama.cpp": (same, False), "llama.cpp-lookup": (same, True), "llama.cpp-q4": (source, False)}
    runners: dict[str, LlamaCpp | LlamaServer] = {}
    try:
        for method in wanted:
            if method in SERVER_METHODS:
                runners[method] = LlamaServer(component or base, component is None, threads,
                                              cache_dir() / "bench-llama-server", max_new_tokens,
                                              eagle3=method == "llama.cpp-eagle3")
            else:
                runners[method] = LlamaCpp(files[method][0], threads, lookup=files[method][1])
    except BaseException:
        for runner in runners.values():  # no process left behind
            runner.close()
        raise
    return runners


def llama_systems(runners: dict) -> dict:
    """What a report records of the llama.cpp that ran: the binding's build (llama_cpp_system), and llama-server's
    command settings where llama.cpp-eagle3 ran (llama_server)."""
    out = {}
    binding = [r for r in runners.values() if isinstance(r, LlamaCpp)]
    if binding:
        out["llama_cpp_system"] = binding[0].system
    servers = [r for r in runners.values() if isinstance(r, LlamaServer)]
    if servers:
        out["llama_server"] = max((r.serves for r in servers), key=len)  # the draft's, where one ran
    return out


def check_build(base: str = "smollm2-135m") -> str:
    """Run the installed llama.cpp once on the base model's GGUF, a prompt of several tokens (a batch: the kernels
    a bad build crashes in), and return what it was built to use. `make setup-llama` runs it after the build, so a
    build that crashes fails there, with its cause, rather than in the middle of a bench or the test suite."""
    from ppdkit.models.catalog import base_gguf

    runner = LlamaCpp(base_gguf(base), threads=1)
    try:
        runner.generate(list(range(1, 33)), 4)
    finally:
        runner.close()
    return runner.system


if __name__ == "__main__":
    try:
        print(f"llama.cpp built for: {check_build()}")
    except RuntimeError as error:
        sys.exit(f"setup-llama: the llama.cpp just installed does not run here. {error}")
