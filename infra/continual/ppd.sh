#!/usr/bin/env bash
# The continual training of the committed prompt tokens, in the background of every working session beside the
# corpus job (ppdkit/jobs/configs/smollm2-ppd-continual.yaml: online, on the committed corpus, from the committed
# component), then its gate.
#   bash infra/continual/ppd.sh start [ppdkit run options]   start it, niced (rerun: it resumes from its checkpoints;
#                                            a corpus grown since its data stage needs --force, a new run)
#   bash infra/continual/ppd.sh pause | resume | stop         as infra/corpus/background.sh (every process of the job)
#   bash infra/continual/ppd.sh adopt [ppdkit adopt options]  the gate: its calibrated component against the
#                                            committed one on all 80 MT-Bench first turns; commit the component if adopted
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=${PPDKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ppdkit}
PIDFILE=${PIDFILE:-$CACHE/ppd-continual.pid}
LOG=${LOG:-$CACHE/ppd-continual.log}
OUT=${OUT:-$CACHE/runs/ppd-continual}
COMPONENT=ppdkit/models/components/smollm2-135m-ppd
source infra/background/niced.sh
case "${1:-}" in
start) start_niced ppd-continual .venv/bin/ppdkit run ppdkit/jobs/configs/smollm2-ppd-continual.yaml --output "$OUT" \
    "${@:2}" ;;
pause) signal STOP ;;
resume) signal CONT ;;
stop) signal TERM; signal CONT ;;
adopt)
    if running; then echo "the job is still running (log $LOG): adopt once it has ended" >&2; exit 2; fi
    .venv/bin/ppdkit adopt "$OUT/calibrate/component" --component "$COMPONENT" --run "$OUT" "${@:2}" ;;
*)
    echo "usage: ppd.sh start [options] | pause | resume | stop | adopt [options]" >&2
    exit 2 ;;
esac
