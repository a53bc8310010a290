#!/usr/bin/env bash
# Sourced by stop-local-head.sh and stop-local-worker.sh: stop_ray_start PIDFILE stops the `ray start --block` whose
# pid is in PIDFILE (it stops its node's processes on SIGTERM), and no other Ray; SIGKILL after 30 s.
stop_ray_start() {
    local pidfile="$1" pid
    pid="$(cat "$pidfile")"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}
