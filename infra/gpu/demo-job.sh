#!/usr/bin/env bash
# The demo job on the device machine (infra/gpu/README.md), in the repository's root there:
#   demo-job.sh stash             keep this call's part of the payload (.gpu-lane/demo/part-*, from
#                                 `prepare.sh demo`) in /root/ppdkit-demo, which outlives the call while the machine
#                                 stays warm (30 s between calls)
#   demo-job.sh unpack            check the stashed parts against manifest.txt and unpack the payload (the wheels
#                                 the image lacks, installed for its Python; SmolLM2's GGUF) into the stash
#   demo-job.sh run [key=value]   stash this call's part too, unpack, then run the demo job on the GPU (any
#                                 overrides after the GPU's own) and write what ran to $OUT: demo.json (the GPU,
#                                 versions, the device plan, checks of each device choice, every stage's summary,
#                                 timings), job.log, mlflow.db
set -euo pipefail
cd "$(dirname "$0")/../.."
STASH=${DEMO_STASH:-/root/ppdkit-demo}
# The demo on one GPU: prompts and answers the base model writes itself (data.source magpie), regenerated in one
# batch on the GPU; one training rank for the one GPU (a second would wait for a GPU forever); the machine's 16 cores.
GPU_OVERRIDES=(data.source=magpie data.limit=64 teacher.regenerate=true teacher.max_new_tokens=64 ray.num_cpus=16
               teacher.cpus_per_worker=4 train.num_workers=1 train.cpus_per_worker=8)

stash() {
    mkdir -p "$STASH/parts"
    cp .gpu-lane/demo/part-* .gpu-lane/demo/manifest.txt "$STASH/parts/" 2>/dev/null || true
    ls -l "$STASH/parts"
}

unpack() {  # the parts put together, checked against the manifest's sha256, unpacked into $STASH/payload
    local manifest=$STASH/parts/manifest.txt missing=()
    [[ -f $manifest ]] || { echo "demo-job.sh: no manifest.txt: carry it with the last part" >&2; exit 3; }
    for part in $(tail -n +2 "$manifest"); do [[ -f $STASH/parts/$part ]] || missing+=("$part"); done
    if (( ${#missing[@]} )); then
        echo "demo-job.sh: parts never stashed (the machine went back between calls?): ${missing[*]}" >&2
        exit 3
    fi
    (cd "$STASH/parts" && cat $(tail -n +2 manifest.txt)) > "$STASH/payload.tar.xz"
    echo "$(head -1 "$manifest")  $STASH/payload.tar.xz" | sha256sum -c -
    rm -rf "$STASH/payload" && mkdir -p "$STASH/payload"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="data")' \
        "$STASH/payload.tar.xz" "$STASH/payload"
    touch "$STASH/payload/.complete"
}

case "${1:-}" in
stash) stash ;;
unpack) unpack ;;
run)
    started=$(date +%s)
    out=${OUT:?the device tool sets OUT}
    stash
    [[ -f $STASH/payload/.complete ]] || unpack  # a rerun on the same warm machine unpacks nothing again
    export PYTHONPATH="$STASH/payload/site:$STASH/payload/models:$PWD" PPDKIT_CACHE="$STASH/cache" \
        HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true
    # what it found is in demo.json, whatever failed
    python3 infra/gpu/demo_report.py preflight --out "$out" --site "$STASH/payload/site" || true
    set +e
    # stopped (as by Ctrl-C: Ray is shut down) early enough that what ran still comes back within the call's limit
    timeout --signal=INT --kill-after=30 "${DEMO_JOB_SECONDS:-390}" python3 -m ppdkit.cli.main run \
        ppdkit/jobs/configs/demo.yaml --output "$STASH/run" "${GPU_OVERRIDES[@]}" "${@:2}" 2>&1 | tee "$out/job.log"
    code=${PIPESTATUS[0]}
    set -e
    python3 infra/gpu/demo_report.py collect --out "$out" --run "$STASH/run" --exit-code "$code" --started "$started"
    exit "$code" ;;
*)
    echo "usage: demo-job.sh stash | unpack | run [key=value ...]" >&2
    exit 2 ;;
esac
