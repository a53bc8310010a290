"""`ppdkit export --format gguf` (ppdkit/models/gguf_export.py): the committed EAGLE-3 draft as a GGUF that llama.cpp's
own llama-server runs as its draft (`-md`, `--spec-type draft-eagle3`): its greedy answers are llama-server's plain
ones, and it keeps more of its guesses than a draft of random weights does. The servers are serve-bench's own kinds
(`llama.cpp`, `llama.cpp-eagle3`), started as it starts them."""

import json
import shutil
import urllib.request

import pytest
import torch

from ppdkit.bench.serving_backends import (SERVERS, ServeBenchSettings, Unavailable, free_port, llama_server_binary,
                                           running)
from ppdkit.models.artifact import ArtifactError, read_component, write_component
from ppdkit.models.gguf_export import DRAFT_FILE, RECORD, export_gguf, llama_cpp_converter
from ppdkit.models.paths import file_sha256

COMPONENTS = "ppdkit/models/components"
PROMPTS = ("Write a haiku about the sea.", "What is the capital of France? Answer in one sentence.",
           "List three uses of a paperclip.", "Write a Python function that reverses a string.",
           "Explain what a hash table is in two sentences.", "Give me a short motivational quote.",
           "What are the primary colors?", "Write a polite email declining a meeting invitation.")


def test_only_an_eagle3_draft_goes_to_llama_cpp(tmp_path):
    with pytest.raises(ArtifactError, match="holds a 'ept' component: llama.cpp runs EAGLE-3 drafts only"):
        export_gguf(f"{COMPONENTS}/smollm2-135m-ppd", tmp_path / "out")
    with pytest.raises(ValueError, match="outtype 'q4_0': use one of auto, f32, f16, bf16, q8_0"):
        export_gguf(f"{COMPONENTS}/smollm2-135m-eagle3", tmp_path / "out", "q4_0")
    assert not (tmp_path / "out").exists()


def _llama_or_skip() -> None:
    try:
        llama_server_binary(None)
        llama_cpp_converter()
    except (Unavailable, ArtifactError) as error:
        pytest.skip(f"{error} (make setup-llama-server)")


def _random_draft(into, seed: int = 0):
    """The committed draft's shapes and vocabulary with weights of the same scale drawn at random: the control."""
    committed = read_component(f"{COMPONENTS}/smollm2-135m-eagle3")
    g = torch.Generator().manual_seed(seed)
    tensors = {k: (torch.randn(v.shape, generator=g) * v.float().std()).to(v.dtype) if v.is_floating_point() else v
               for k, v in committed.tensors.items()}
    write_component(into, "eagle3", committed.hyperparameters, committed.base_model["name"],
                    committed.base_model["fingerprint"], {"control": "random weights"}, tensors)
    return into


def _answers(kind: str, draft, work) -> tuple[list[str], float]:
    """serve-bench's llama.cpp server kind (`llama.cpp`, or `llama.cpp-eagle3` with `draft` exported as its EAGLE-3
    draft): its greedy answers to PROMPTS and the share of drafted tokens it accepted."""
    settings = ServeBenchSettings(source=f"{COMPONENTS}/smollm2-135m-eagle3", base_only=False, draft=draft,
                                  threads=2, max_tokens=64, work=work)
    port = free_port()
    answers, drafted, accepted = [], 0, 0
    with running(SERVERS[kind](settings, port), port, work / f"{kind}.log", timeout=120) as server:
        for prompt in PROMPTS:
            body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": 64,
                               "temperature": 0}).encode()
            request = urllib.request.Request(f"{server.url}/v1/chat/completions", body,
                                             {"Content-Type": "application/json"})
            reply = json.loads(urllib.request.urlopen(request, timeout=120).read())
            answers.append(reply["choices"][0]["message"]["content"])
            drafted += reply["timings"].get("draft_n", 0)
            accepted += reply["timings"].get("draft_n_accepted", 0)
    return answers, accepted / max(drafted, 1)


def test_llama_server_runs_the_exported_draft_and_keeps_its_answers(tmp_path):
    _llama_or_skip()
    out = export_gguf(f"{COMPONENTS}/smollm2-135m-eagle3", tmp_path / "draft")
    record = json.loads((out / RECORD).read_text())
    assert record["sha256"] == file_sha256(out / DRAFT_FILE) and record["fingerprint"].startswith("sha256:")
    for name in ("plain", "trained", "random"):
        (tmp_path / name).mkdir()
    plain, _ = _answers("llama.cpp", None, tmp_path / "plain")
    drafted, kept = _answers("llama.cpp-eagle3", f"{COMPONENTS}/smollm2-135m-eagle3", tmp_path / "trained")
    _, kept_by_chance = _answers("llama.cpp-eagle3", str(_random_draft(tmp_path / "random-draft")), tmp_path / "random")
    same = sum(a == b for a, b in zip(plain, drafted))
    assert same >= 7, f"{same}/8 answers as llama-server's plain ones"  # the 90%, of 8
    assert kept > kept_by_chance + 0.05, (kept, kept_by_chance)
    shutil.rmtree(tmp_path)


def test_the_bench_times_llama_cpp_with_the_draft_against_its_own_plain_server(tmp_path):
    """`ppdkit bench --methods llama.cpp-eagle3`: the committed draft run by llama-server, held to llama-server's plain
    answers (llama.cpp-server, added by the bench), with its tokens a step from the server's own count."""
    _llama_or_skip()
    from ppdkit.bench.decoding import run_bench

    report = run_bench(f"{COMPONENTS}/smollm2-135m-eagle3", "mt-bench", 2, 32, ["ar", "llama.cpp-eagle3"])
    rows = {r["method"]: r for r in report["results"]}
    assert rows["llama.cpp-eagle3"]["compared_with"] == "llama.cpp-server" and "llama.cpp-server" in rows
    assert rows["llama.cpp-eagle3"]["identical_to_greedy"] == 1.0  # 2 of 2 answers: the drafted ones are plain's
    assert rows["llama.cpp-eagle3"]["mean_accepted_per_step"] > 1.0 == rows["llama.cpp-server"][
        "mean_accepted_per_step"]
    assert report["llama_server"]["draft"].endswith("smollm2-135m-eagle3")


def test_serve_bench_holds_the_drafting_server_to_its_plain_twin(tmp_path):
    """serve-bench's llama.cpp-eagle3 answers at 1 client, compared with llama.cpp's (the same llama-server without the
    draft): same_as_plain in the report and its table. Its draft goes out in Q8_0 blocks (--draft-outtype)."""
    _llama_or_skip()
    import gguf

    from ppdkit.bench.serving_load import print_table, run_serve_bench

    settings = ServeBenchSettings(source=f"{COMPONENTS}/smollm2-135m-eagle3", base_only=False, threads=2,
                                  max_tokens=24, work=tmp_path, draft_outtype="q8_0")
    report = run_serve_bench(["llama.cpp", "llama.cpp-eagle3"], settings, list(PROMPTS[:2]), "test", [1])
    plain, drafting = report["servers"]
    assert plain["status"] == drafting["status"] == "ran" and "same_as_plain" not in plain
    assert drafting["same_as_plain"] == {"server": "llama.cpp", "equal": 2, "compared": 2}
    assert "texts" not in drafting  # the answers stay out of the report
    assert drafting["serves"]["draft_outtype"] == "q8_0"
    matrices = {t.tensor_type.name for t in gguf.GGUFReader(tmp_path / "eagle3-gguf" / DRAFT_FILE).tensors
                if len(t.shape) == 2 and t.tensor_type.name != "I64"}
    assert matrices == {"Q8_0"}, matrices
    print_table(report)
