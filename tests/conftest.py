import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from ppdkit.data_pipeline.config import DataConfig  # pydantic only: no Ray, torch or cache read at import
from ppdkit.models.config import BaseModelConfig

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


# the tiny model, float32, and the fixture conversations' data stage: what the training tests train on
TINY_BASE = BaseModelConfig(name="tiny-llama", quantization="none")
TINY_DATA = DataConfig(source=str(FIXTURES / "conversations.jsonl"), limit=None, max_length=64, holdout=0.3, shards=1,
                       check_sequences=0)


_made_cache: list[str] = []


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1 (for a server a test starts, or an address that must not answer)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytest_configure(config):
    # Tests never touch the user's cache or tracking store. PPDKIT_TEST_CACHE keeps one between runs
    # (saves the SmolLM2 conversion when iterating locally); CI starts from nothing.
    from ppdkit.models.paths import cache_dir

    users = cache_dir() / "llama.cpp"  # what `make setup-llama-server` built (llama-server, its converter): read only
    cache = os.environ.get("PPDKIT_TEST_CACHE")
    if not cache:
        cache = tempfile.mkdtemp(prefix="ppdkit-test-cache-")
        _made_cache.append(cache)
    if users.is_dir() and not (Path(cache) / "llama.cpp").exists():
        (Path(cache) / "llama.cpp").symlink_to(users, target_is_directory=True)
    os.environ["PPDKIT_CACHE"] = cache
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("RAY_ADDRESS", None)
    from ppdkit.jobs.ray_session import keep_local_ray_on_loopback, quick_train_polls

    keep_local_ray_on_loopback()  # local Ray on 127.0.0.1 (read at import): before any test imports ray
    quick_train_polls()  # for the `ray start` clusters tests start too (infra/ray), which inherit it


# `make test-fast`, the inner loop, runs what neither starts Ray (the teacher pass, Ray Train, a pipeline), nor a
# server or another process: a test is marked `integration` when it or a fixture it uses (directly or through
# another) asks for a local Ray or starts one of those. `make test` runs both tiers, as CI does.
STARTS_A_SERVICE = ("ray_local", "subprocess", "run_training(", "run_teacher_stage(", "run_pipeline(", "_ppdkit(",
                    "main([", "uvicorn", "serve(")


def pytest_collection_modifyitems(config, items):
    import inspect

    for item in items:
        functions = [getattr(item, "function", None)]
        fixtures = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        functions += [definition.func for name in getattr(item, "fixturenames", ()) for definition in
                      fixtures.get(name, ()) if name != "request"]
        sources = "\n".join(inspect.getsource(f) for f in functions if inspect.isfunction(f))
        if any(call in sources for call in STARTS_A_SERVICE):
            item.add_marker(pytest.mark.integration)


def _machine_line() -> str:
    from ppdkit.bench.decoding import describe_machine, machine_info

    return describe_machine(machine_info())


def pytest_sessionstart(session):
    """The CPU first too: a CI run cut off at its time limit never reaches the summary."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"running on: {_machine_line()}")


SLOW_TEST_S = 60


def pytest_runtest_logreport(report):
    """A test (or its fixtures' setup) that takes over a minute says so as it ends: a cut-off CI log shows where its
    time went."""
    if report.when != "teardown" and report.duration > SLOW_TEST_S:
        print(f"\n[{report.duration:.0f} s {report.when}] {report.nodeid}", flush=True)


def pytest_terminal_summary(terminalreporter):
    """The CPU the suite ran on, last (where a CI log's tail shows it): kernels and llama.cpp's build follow it."""
    terminalreporter.write_line(f"ran on: {_machine_line()}")


@pytest.fixture(autouse=True)
def _torch_threads_left_alone():
    """A test that leaves torch on another thread count changes every test after it (the suite once ran on one
    thread from the features benchmark's test on, and took longer for it): it fails, and the count is put back."""
    import torch

    before = torch.get_num_threads()
    yield
    after = torch.get_num_threads()
    if after != before:
        torch.set_num_threads(before)
        pytest.fail(f"the test left torch on {after} threads, where it found {before}: set them inside "
                    "ppdkit.runtime.forward.devices.torch_threads")


def pytest_unconfigure(config):
    for path in _made_cache:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_local():
    """One real local Ray for the whole session (starting one costs seconds and 1.7 GB)."""
    import ray

    from ppdkit.jobs.ray_session import local_ray

    with local_ray(num_cpus=2, object_store_mb=512, log_to_driver=False):
        yield ray


@pytest.fixture(scope="session")
def teacher_dir(ray_local, tmp_path_factory) -> Path:
    """The tiny model's teacher cache of the fixture conversations (float32 targets), and beside it (../features)
    one that keeps the base model's features too: made once for the session (a data stage and two teacher passes
    on Ray), read by the training tests of several modules."""
    from ppdkit.data_pipeline.config import TeacherConfig
    from ppdkit.data_pipeline.data_stage import run_data_stage
    from ppdkit.data_pipeline.teacher_stage import run_teacher_stage

    root = tmp_path_factory.mktemp("pipeline")
    run_data_stage(TINY_BASE, TINY_DATA, root / "data")
    # float32: the recorded losses of test_training and test_draft_heads were made with the float32 teacher
    teacher = TeacherConfig(workers=1, top_k=16, compute_dtype="float32")
    run_teacher_stage(TINY_BASE, TINY_DATA, teacher, root / "data", root / "teacher")
    run_teacher_stage(TINY_BASE, TINY_DATA, teacher.model_copy(update={"features": True}), root / "data",
                      root / "features")
    return root / "teacher"


@pytest.fixture
def tracking_uri(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def tiny_dir():
    from ppdkit.models.catalog import materialize

    return materialize("tiny-llama")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def tiny_f64():
    """The tiny Llama in float64 (decoding tests compare tokens exactly) and its tokenizer."""
    from ppdkit.models.tiny import build_tiny_llama

    model, tok = build_tiny_llama()
    return model.double().eval(), tok


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """transformers' own greedy decoding: the reference every drafter must reproduce."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(ids):].tolist()


def assert_gives_hf_greedy(decoder, model, method: str, ids: list[int], budget: int, case) -> None:
    """`method`'s output is transformers' greedy tokens, stopped only by the budget or an end token."""
    truth = hf_greedy(model, ids, budget)
    out = decoder.generate(ids, max_new_tokens=budget, method=method).tokens
    assert out == truth[:len(out)], case
    assert len(out) == budget or out[-1] in decoder.eos_ids(), case


def kernels_or_skip(variant: str):
    """The runtime's native kernels for this CPU ("native"), their AVX2 build ("avx2": on an AVX-512
    machine the narrower path is tested too; without AVX-512 it is the native build), or skip where they cannot be
    built."""
    from ppdkit.runtime.kernels.native import build_kernels, cpu_info, cpu_supports_kernels, native_kernels

    compiler = shutil.which(os.environ.get("CXX", "c++"))  # the compiler PyTorch's extension builder calls
    flags = cpu_info().get("flags", "").split()
    if variant == "native" or "avx512f" not in flags:  # without AVX-512, -march=native is the AVX2 build already:
        # a second compile of the same code took 3 minutes of a CI run on a 2-core AVX2 EPYC
        if compiler:  # a supported CPU with a compiler must build them: a broken build fails here
            assert (native_kernels() is not None) == cpu_supports_kernels()
        module = native_kernels()  # None where the CPU lacks AVX2 with FMA too
    else:
        module = build_kernels(("-mno-avx512f",)) if compiler else None
    if module is None:
        pytest.skip(f"the {variant} kernels cannot be built here (CPU or C++ compiler)")
    return module


def tiny_model_on(path: str, monkeypatch):
    """The float32 tiny Llama and its tokenizer, for decoders whose layers run on the native kernels ("native")
    or the PyTorch layers ("pytorch")."""
    import ppdkit.runtime.forward.linear as linear_module
    from ppdkit.models.tiny import build_tiny_llama

    module = kernels_or_skip("native") if path == "native" else None
    monkeypatch.setattr(linear_module, "native_kernels", lambda: module)
    model, tok = build_tiny_llama()
    return model.float().eval(), tok


def q4_weights_or_skip(model) -> dict:
    """The Decoder arguments that put `model`'s matmuls on 4-bit blocks quantized from its weights (the int8 kernel),
    or skip where this CPU has no AVX512-VNNI."""
    from ppdkit.runtime.forward.gguf_blocks import quantize_model

    if not kernels_or_skip("native").quantized_available():
        pytest.skip("this CPU has no AVX512-VNNI: the q4 format is not built here")
    return {"quantized": quantize_model(model), "weight_format": "q4"}


def plain_tiny_decoder(path: str, monkeypatch):
    """The float32 tiny Llama's decoder without a component, on `path` (tiny_model_on; "native-q4": its weights
    as 4-bit blocks on the int8 kernel, what auto runs SmolLM2 on where the CPU has VNNI), checked to really run
    there."""
    from ppdkit.runtime.decoder import Decoder

    model, tok = tiny_model_on(path.removesuffix("-q4"), monkeypatch)
    weights = q4_weights_or_skip(model) if path == "native-q4" else {}
    decoder = Decoder(model, tok, None, **weights)
    assert (decoder.model.native is not None) == path.startswith("native")
    assert decoder.model.weight_format == ("q4" if weights else "float32")
    return decoder


def lossless_on_random_prompts(decoder, method: str, budget: int, cases: int = 12) -> list:
    """`method`'s results on seeded random prompts of few distinct tokens (contexts repeat), each asserted to be
    plain decoding's tokens; returns (ar's result, method's result) per prompt."""
    import random

    rng, pairs = random.Random(0), []
    for case in range(cases):
        ids = [rng.randrange(3, 30) for _ in range(rng.randint(1, 40))]
        plain, out = decoder.generate(ids, max_new_tokens=budget, method="ar"), decoder.generate(ids,
                                      max_new_tokens=budget, method=method)
        assert out.tokens == plain.tokens, (method, case)
        pairs.append((plain, out))
    return pairs


def write_tiny_ppd_component(directory: Path) -> Path:
    """A PPD component for the tiny Llama as the calibrate stage writes one: 3 random prompt tokens, a calibrated tree of
    8 nodes, a corpus n-gram table."""
    import torch

    from ppdkit.data_pipeline.ngram_cache import build_ngram_table
    from ppdkit.models.artifact import write_component, write_ngrams
    from ppdkit.models.loading import load_base_model
    from ppdkit.runtime.trees.tree import best_tree_for_size

    write_component(directory, "ept", {"num_prompt_tokens": 3, "num_epts": 1, "mask": "ensemble"}, "tiny-llama",
                    load_base_model("tiny-llama").fingerprint, {},
                    {"prompt_embeddings": torch.randn(3, 1, 64, generator=torch.Generator().manual_seed(0))},
                    extras={"trees": {"trees": {"8": best_tree_for_size([[0.5, 0.2], [0.3, 0.1], [0.2]], 8).to_json()}}})
    write_ngrams(directory, build_ngram_table([[5, 6, 7, 8] * 3], max_n=2, branches=2, length=3).to_tensors())
    return directory
