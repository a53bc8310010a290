"""vLLM's CPU build (its own venv, `make setup-vllm`) serves SmolLM2 with the committed EAGLE-3 draft's export
(`ppdkit export --format speculators`): it takes the draft's tokens (acceptance above 0 in its spec-decode counters),
and its greedy text equals its own plain greedy text (float32: bfloat16 lets a multi-token verification flip a
near-tie, which is vLLM's kernels, not the draft)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from ppdkit.bench.decoding import load_prompts
from ppdkit.models.catalog import materialize
from ppdkit.models.eagle3_export import export_eagle3

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[1]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_READY = ROOT / ".venv-vllm" / ".ppdkit-setup"  # written by `make setup-vllm` once `import vllm` works
CONSUMER = Path(__file__).parent / "consumers" / "vllm_generate.py"
COMPONENT = ROOT / "ppdkit" / "models" / "components" / "smollm2-135m-eagle3"


def _generate(out: Path, prompts: Path, *draft: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": "", "VLLM_LOGGING_LEVEL": "WARNING"}
    done = subprocess.run([str(VLLM_PYTHON), str(CONSUMER), str(materialize("smollm2-135m")), str(prompts), str(out),
                           "--max-tokens", "48", *draft], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.skipif(not VLLM_READY.exists(), reason="vLLM's CPU build is installed by `make setup-vllm`")
def test_vllm_serves_the_exported_draft_takes_its_tokens_and_keeps_its_greedy_text(tmp_path):
    draft = export_eagle3(COMPONENT, tmp_path / "draft", "speculators")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in load_prompts("mt-bench", 3)))
    plain = _generate(tmp_path / "plain.json", prompts)
    drafted = _generate(tmp_path / "drafted.json", prompts, "--draft", str(draft), "--num-speculative-tokens", "3")
    print("vLLM-CPU float32 tokens/s: plain", plain["tokens_per_second"], "with the draft",
          drafted["tokens_per_second"], "spec decode", drafted["spec_decode"])
    assert drafted["spec_decode"]["drafted"] > 0 and drafted["spec_decode"]["accepted"] > 0
    assert drafted["token_ids"] == plain["token_ids"]
