#!/usr/bin/env bash
# Ready what the GPU lane (ppdkit/jobs/gpu_lane.py) carries to a lent GPU machine, in .gpu-lane/ (ignored by git):
# - wheels for its Python 3.12 of what its image lacks and the lane needs: pydantic (ppdkit's configs), gguf (reading
#   SmolLM2's GGUF); its image has torch, transformers, accelerate, pyarrow, safetensors, numpy and tqdm;
# - SmolLM2's Q4_1 GGUF (98 MB) cut into parts that each travel beside the working tree: one device call carries
#   64 MiB in all, the tree included, so the parts are as large as what the tree leaves free.
# Then the calls of docs/devices.md#the-gpu-lane: `lane.sh stash` once per part, `lane.sh run` last.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
LANE=.gpu-lane
rm -rf "$LANE" && mkdir -p "$LANE/wheels"
"$PY" -m pip download --quiet --no-deps --dest "$LANE/wheels" --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --implementation cp \
    "pydantic==$("$PY" -c 'import pydantic; print(pydantic.VERSION)')" \
    "pydantic-core==$("$PY" -c 'import pydantic_core; print(pydantic_core.__version__)')" \
    annotated-types typing-inspection "gguf==$("$PY" -c 'import importlib.metadata as m; print(m.version("gguf"))')"
gguf=$("$PY" -c 'from ppdkit.models.smollm2 import smollm2_gguf; print(smollm2_gguf())')
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb | tail -1 | cut -f1)  # what travels
free=$(( 64 * 1024 * 1024 - tree - $(du -sb "$LANE/wheels" | cut -f1) - 4 * 1024 * 1024 ))
if (( free < 8 * 1024 * 1024 )); then
    echo "prepare.sh: the working tree ($tree bytes) leaves under 8 MiB a call for the model: too many calls" >&2
    exit 1
fi
split -b "$free" -d -a 2 "$gguf" "$LANE/gguf.part-"
sha256sum "$gguf" | cut -d' ' -f1 > "$LANE/gguf.sha256"
ls "$LANE"/gguf.part-* | while read -r part; do echo "carry: $part"; done
echo "the wheels and $LANE/gguf.sha256 travel with the first part"
