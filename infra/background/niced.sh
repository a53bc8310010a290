# Shared by the background jobs of every working session (infra/corpus/background.sh, infra/continual/ppd.sh):
# start one niced in a scheduling group of its own, pause it for a timing, resume it, stop it. Source it after
# setting PIDFILE and LOG.
running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
paused() { running && [ "$(ps -o stat= -p "$(cat "$PIDFILE")" | cut -c1)" = T ]; }
# a paused job's children are stopped too: the signal goes to every process of its session (start_niced's setsid),
# since Ray's workers of a training job run in process groups of their own within it
signal() { if running; then pkill "-$1" -s "$(cat "$PIDFILE")" || true; fi; }
# start_niced NAME COMMAND...: COMMAND in the background at nice 19, its pid in $PIDFILE, its output in $LOG.
# niced: it takes the cores nothing else wants, so tests and builds beside it run at their own speed.
# setsid gives the job a scheduling autogroup of its own, and the kernel shares the cores between autogroups
# first: a nice inside one only ranks that group's own threads (the job took ~3/4 of a core beside a build).
# The group's nice is what ranks it against the rest, and the job sets it itself, once setsid has made its group:
# written from here it could land before setsid ran, on this shell's group, and leave the job's at 0 (seen: the
# job took a core and a half beside a decode).
start_niced() {
    local name=$1
    shift
    if running; then echo "already running: pid $(cat "$PIDFILE")"; return 0; fi
    mkdir -p "$(dirname "$PIDFILE")" "$(dirname "$LOG")"
    setsid nohup bash -c 'if [ -w /proc/self/autogroup ]; then echo 19 >/proc/self/autogroup; fi
        exec nice -n 19 "$@"' "$name" "$@" >"$LOG" 2>&1 &
    echo $! >"$PIDFILE"
    echo "$name: pid $(cat "$PIDFILE"), log $LOG"
}
