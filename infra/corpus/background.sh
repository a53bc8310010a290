#!/usr/bin/env bash
# The corpus job of every working session: `ppdkit corpus grow` on the committed corpus, in the background.
#   bash infra/corpus/background.sh start    start it (its pid in $PIDFILE, its log in $LOG)
#   bash infra/corpus/background.sh pause    SIGSTOP, while something is being timed or decodes on every core: it
#                                            slowed a 2-thread decode on 2 cores about 100x once, when its nice ranked
#                                            it only inside its own autogroup (see start; a decode's threads wait at
#                                            each barrier for the slowest); a timing wants the cores to itself anyway
#   bash infra/corpus/background.sh resume   SIGCONT
#   bash infra/corpus/background.sh stage    pause, make docs/corpus.md again, `git add` corpus.json and exactly the
#                                            shards it lists, resume unless it was paused before: then commit
#   bash infra/corpus/background.sh stop     SIGTERM (the shard being written is lost; the rest stay)
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=${PPDKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ppdkit}
PIDFILE=${PIDFILE:-$CACHE/corpus-grow.pid}
LOG=${LOG:-$CACHE/corpus-grow.log}
CORPUS=ppdkit/data_pipeline/corpora/smollm2-135m
source infra/background/niced.sh
case "${1:-}" in
start) start_niced corpus-job .venv/bin/ppdkit corpus grow rows_per_shard=256 "${@:2}" ;;
pause) signal STOP ;;
resume) signal CONT ;;
stop) signal TERM; signal CONT ;;  # a paused job takes its TERM once it runs again
stage)
    if ! paused; then  # a job paused for a timing stays paused
        signal STOP
        trap 'signal CONT' EXIT
    fi
    .venv/bin/python docs/tools/corpus_page.py
    mapfile -t listed < <(.venv/bin/python -c "import json, sys; m = json.load(open(sys.argv[1]))
print('\n'.join(sys.argv[2] + '/' + s['file'] for s in m['shards']))" "$CORPUS/corpus.json" "$CORPUS")
    git add "$CORPUS/corpus.json" docs/corpus.md "${listed[@]}"
    echo "staged corpus.json, docs/corpus.md and ${#listed[@]} shards: commit them" ;;
*)
    echo "usage: background.sh start [key=value ...] | pause | resume | stage | stop" >&2
    exit 2 ;;
esac
