"""llama.cpp as a baseline in `ppdkit bench` (llama-cpp-python, the optional extra `ppdkit[llama]`).

The comparison users make: the same base model, the same prompt token ids (ppdkit's chat template), greedy, the
same threads. Three methods:
- `llama.cpp`: plain decoding of a GGUF at the runtime's precision (bf16 or f32), written once into the cache from
  the base model's own GGUF (SmolLM2's Q4_1 from its package: its metadata and tokenizer, its tensors de-quantized,
  which are exactly the weights ppdkit's runtime holds); with the runtime on `gguf`, that file itself;
- `llama.cpp-lookup`: the same file with llama.cpp's prompt-lookup speculative decoding;
- `llama.cpp-q4`: the package's Q4_1 file itself, plain: the bar for a 4-bit runtime.
llama.cpp's speculative outputs are compared with its own plain decoding, not with ppdkit's: its kernels round
differently, and it makes no promise that drafting leaves them unchanged.
"""

import importlib.util
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ppdkit.models.paths import cache_dir
from ppdkit.runtime.dtypes import BLOCK_FORMATS

log = logging.getLogger(__name__)

LLAMA_METHODS = ("llama.cpp", "llama.cpp-lookup", "llama.cpp-q4")
INSTALL_HINT = 'pip install "ppdkit[llama]"   (llama-cpp-python, built for this CPU: a few minutes)'
LOOKUP_TOKENS = 10  # drafted tokens per step, as transformers' prompt lookup in hf-pld


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

    llama.cpp runs on a thread of its own. Its AMX kernels configure a thread's tiles once and then use them, but
    oneDNN's AMX kernels (PyTorch's bfloat16 matmuls: prefill, transformers' baselines) release the tiles of the
    thread they ran on, so llama.cpp on the caller's thread died on its next tile load (SIGILL, seen). The thread
    that drives llama.cpp runs nothing else."""

    def __init__(self, path: Path, threads: int, lookup: bool = False, context: int = 2048):
        if not llama_cpp_available():
            raise ValueError(f"the llama.cpp baseline needs llama-cpp-python: {INSTALL_HINT}")
        self.path = path
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama.cpp")
        self.llm = self.thread.submit(self._load, path, threads, lookup, context).result()
        self.eos = self.llm.token_eos()

    @staticmethod
    def _load(path: Path, threads: int, lookup: bool, context: int):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS) if lookup else None
        return Llama(model_path=str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                     draft_model=draft, verbose=False)

    def close(self) -> None:
        """Free the model now: llama-cpp-python's own finalizer, run at interpreter exit, can fail noisily."""
        self.thread.submit(self.llm.close).result()
        self.thread.shutdown()

    def generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy new tokens after the prompt ids, up to max_new_tokens or the end token (kept, as ppdkit keeps it)."""
        return self.thread.submit(self._generate, ids, max_new_tokens).result()

    def _generate(self, ids: list[int], max_new_tokens: int) -> list[int]:
        out: list[int] = []
        self.llm.reset()  # else it keeps the KV cache of a prefix shared with the last call, evaluates the prompt in
        # other batches and, its kernels not being row-invariant, can answer otherwise (seen: a repeat that differed)
        for token in self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(token)
            if token == self.eos or len(out) >= max_new_tokens:
                break
        return out


def system_info() -> str:
    """What llama.cpp was built to use on this CPU (its own line: AVX512_VNNI = 1, AMX_INT8 = 1, ...), so a report
    shows whether it ran its fast path."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode(errors="replace").strip(" |\n")


def llama_runners(base: str, dtype: str, methods: list[str], threads: int) -> dict[str, LlamaCpp]:
    """The llama.cpp runner of each llama.cpp method asked for."""
    wanted = [m for m in methods if m in LLAMA_METHODS]
    if not wanted:
        return {}
    if not llama_cpp_available():
        raise ValueError(f"{', '.join(wanted)} need llama-cpp-python: {INSTALL_HINT}")
    from ppdkit.models.catalog import base_gguf  # here: the command line's parsing stays free of torch

    source = base_gguf(base)
    same = widened_gguf(source, dtype) if {"llama.cpp", "llama.cpp-lookup"} & set(wanted) else None
    files = {"llama.cpp": (same, False), "llama.cpp-lookup": (same, True), "llama.cpp-q4": (source, False)}
    return {m: LlamaCpp(files[m][0], threads, lookup=files[m][1]) for m in wanted}
