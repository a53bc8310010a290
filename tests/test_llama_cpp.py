"""llama.cpp as a bench baseline (ppdkit/bench/llama_cpp.py): the GGUF it runs at the runtime's precision holds exactly the
weights ppdkit's runtime holds, and `ppdkit bench` times it beside ar on the same prompt ids, comparing llama.cpp's
prompt lookup with its own plain decoding. The slow test needs llama-cpp-python (CI installs the extra)."""

import os
import signal

import numpy as np
import pytest
import torch

import ppdkit.bench.llama_cpp as llama_module
from ppdkit.bench.decoding import run_bench
from ppdkit.models.catalog import base_gguf


def test_without_llama_cpp_python_the_bench_says_what_to_install(monkeypatch):
    monkeypatch.setattr(llama_module, "llama_cpp_available", lambda: False)
    with pytest.raises(ValueError, match=r"llama-cpp-python: pip install \"ppdkit\[llama\]\""):
        llama_module.llama_runners("smollm2-135m", "bfloat16", ["ar", "llama.cpp"], 2)
    with pytest.raises(ValueError, match="only smollm2-135m comes with one"):
        base_gguf("tiny-llama")  # what the llama.cpp methods need of a base model
    assert llama_module.llama_runners("tiny-llama", "bfloat16", ["ar"], 2) == {}  # no llama.cpp method: nothing


@pytest.mark.slow
def test_llama_cpp_runs_the_same_weights_beside_ar(tmp_path):
    pytest.importorskip("llama_cpp")
    import gguf

    from ppdkit.runtime.forward.precision import bf16_kernels_here

    if not bf16_kernels_here():
        pytest.skip("this CPU runs no bfloat16 kernel: the runtime's weights here are float32")

    from ppdkit.models.loading import load_base_model

    widened = llama_module.widened_gguf(base_gguf("smollm2-135m"), "bfloat16", tmp_path / "s.gguf")
    embedding = next(t for t in gguf.GGUFReader(widened).tensors if t.name == "token_embd.weight")
    ours = load_base_model("smollm2-135m", quantization="none").model.get_input_embeddings().weight.detach()
    assert embedding.tensor_type == gguf.GGMLQuantizationType.BF16
    theirs = torch.from_numpy(gguf.quants.dequantize(embedding.data, embedding.tensor_type).astype(np.float32))
    assert torch.equal(theirs, ours.bfloat16().float())  # the runtime's bfloat16 weights, bit for bit
    report = run_bench("smollm2-135m", "mt-bench", 2, 12, ["ar", "llama.cpp-lookup", "llama.cpp-q4"],
                       base_only=True, dtype="bfloat16")
    rows = {r["method"]: r for r in report["results"]}
    assert set(rows) == {"hf-greedy", "ar", "llama.cpp", "llama.cpp-lookup", "llama.cpp-q4"}  # plain added
    assert rows["llama.cpp-lookup"]["compared_with"] == "llama.cpp" and rows["ar"]["compared_with"] == "ar"
    assert all(r["new_tokens"] > 0 and r["tokens_per_s"] > 0 for r in rows.values())
    assert "AVX" in report["llama_cpp_system"]  # what llama.cpp was built to use, kept with its figures
    assert rows["ar"]["identical_to_greedy"] == 1.0 and 0.0 <= rows["llama.cpp-lookup"]["identical_to_greedy"] <= 1.0


def test_setup_llama_runs_the_build_once_and_names_what_it_was_built_for():
    pytest.importorskip("llama_cpp")
    assert "AVX" in llama_module.check_build()  # a prompt of 32 tokens and 4 new ones went through its kernels


def test_a_crash_in_llama_cpp_is_named_and_ends_its_process_alone():
    pytest.importorskip("llama_cpp")
    runner = llama_module.LlamaCpp(base_gguf("smollm2-135m"), threads=1)
    try:
        assert len(runner.generate([1, 2, 3], 3)) == 3 and "AVX" in runner.system
        os.kill(runner.process.pid, signal.SIGSEGV)  # what a fault in llama.cpp's kernels does to its process
        with pytest.raises(RuntimeError, match=r"llama.cpp's process ended \(signal SIGSEGV\) while generating "
                                               r"with SmolLM2-135M-Instruct.Q4_1.gguf.*make setup-llama"):
            runner.generate([1, 2, 3], 3)
    finally:
        runner.close()
    assert runner.process.returncode == -signal.SIGSEGV  # and this process goes on
