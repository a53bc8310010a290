"""An eagle3 component as a GGUF that llama.cpp runs as its EAGLE-3 draft (`llama-server -m BASE.gguf -md DRAFT.gguf
--spec-type draft-eagle3`).

Not written by hand: the draft goes out in the speculators layout first (models/eagle3_export.py: its tensors
checked against the base model, the draft vocabulary as d2t), then llama.cpp's own converter (`convert_hf_to_gguf.py
--target-model-dir`, which maps an `Eagle3Speculator` checkpoint to its EAGLE3 architecture and takes the
tokenizer from the target) writes the GGUF with its own `gguf` package. Both come from the llama.cpp source that
`make setup-llama-server` builds llama-server from, kept beside it (CONVERTER), so the file is what that very
llama-server reads. Beside the GGUF, export.json records the base model's fingerprint, the component it came from
and the file's sha256.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .paths import cache_dir, file_sha256, write_json_atomic  # light: the command line reads OUTTYPES from here

DRAFT_FILE = "draft.gguf"
RECORD = "export.json"
CONVERTER = "convert"  # in the llama.cpp build's folder: convert_hf_to_gguf.py, conversion/, gguf-py/
SETUP = "`make setup-llama-server` keeps llama.cpp's converter beside the llama-server it builds"
# the converter's --outtype for the draft's matrices: auto (its choice: f16 for our float32 tensors), or one named
OUTTYPES = ("auto", "f32", "f16", "bf16", "q8_0")


def llama_cpp_converter() -> Path:
    """The converter script of the newest llama.cpp build in the cache; a clear error where none was built."""
    from .artifact import ArtifactError  # here: artifact imports torch
    found = sorted((cache_dir() / "llama.cpp").glob(f"llama-cpp-python-*/{CONVERTER}/convert_hf_to_gguf.py"))
    if not found:
        raise ArtifactError(f"llama.cpp's GGUF converter is not in {cache_dir() / 'llama.cpp'}: {SETUP} (run it, "
                            "then export again)")
    return found[-1]


def export_gguf(component_dir: Path, out: Path, outtype: str = "auto") -> Path:
    """Write the eagle3 component in `component_dir` to out/draft.gguf (and out/export.json), its matrices in `outtype`
    (OUTTYPES); the directory is replaced. Refuses another method's component, another base model's, and a base model
    without a GGUF."""
    from .artifact import ArtifactError, read_component
    from .catalog import base_gguf, materialize
    from .eagle3_export import export_eagle3

    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r}: use one of {', '.join(OUTTYPES)}")
    component = read_component(Path(component_dir))
    if component.method != "eagle3":
        raise ArtifactError(f"{component_dir} holds a {component.method!r} component: llama.cpp runs EAGLE-3 drafts only "
                            "(train one with train.method: eagle3)")
    name = component.base_model["name"]
    try:
        base_file = base_gguf(name)  # what the draft is served beside: a draft for a base llama.cpp cannot load is none
    except ValueError as error:
        raise ArtifactError(f"{component_dir}: {error}; llama.cpp serves the draft beside its base's GGUF") from None
    converter = llama_cpp_converter()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as work:
        speculators = export_eagle3(Path(component_dir), Path(work) / "speculators", "speculators")
        env = {**os.environ, "PYTHONPATH": str(converter.parent / "gguf-py")}  # the converter's own gguf package
        done = subprocess.run([sys.executable, str(converter), str(speculators), "--target-model-dir",
                               str(materialize(name)), "--outfile", str(tmp / DRAFT_FILE), "--outtype", outtype],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
            raise ArtifactError(f"llama.cpp's converter ({converter}) could not write the draft:\n{tail}")
    digest = file_sha256(Path(component_dir) / "component.json")
    write_json_atomic(tmp / RECORD, {
        "format": "gguf", "file": DRAFT_FILE, "outtype": outtype, "sha256": file_sha256(tmp / DRAFT_FILE),
        "converter": f"llama.cpp of {converter.parents[1].name}", "base_model": name,
        "fingerprint": component.base_model["fingerprint"], "base_gguf": base_file.name,
        "component": {"name": Path(component_dir).resolve().name, "component_json_sha256": digest},
        "serve": f"llama-server -m {base_file.name} -md {DRAFT_FILE} --spec-type draft-eagle3"})
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
