#!/usr/bin/env bash
# A Ray worker node on this machine, joining the head of start-local-head.sh (GCS on $RAY_GCS_PORT or 6390): a second
# node with its own temp dir, ports and CPUs, so a job spreads over two nodes and a node can be lost without losing
# the head. It runs in the background; stop-local-worker.sh NAME stops it (and only it).
# Usage: infra/ray/add-local-worker.sh NAME [NUM_CPUS]        e.g. add-local-worker.sh w1 2
# Its pid and log are in $PPDKIT_CACHE/ray-worker-NAME/; its Ray temp dir (sockets, session logs) is
# /tmp/ray-<GCS port>-NAME: a short path, as a Unix socket's path must be (107 bytes).
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
ray="${RAY:-$here/.venv/bin/ray}"
name="${1:?usage: add-local-worker.sh NAME [NUM_CPUS]}"
gcs="${RAY_GCS_PORT:-6390}"
state="${PPDKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ppdkit}/ray-worker-$name"
mkdir -p "$state"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0  # 127.0.0.1 only (start_worker_node.py)
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"  # the head's mode (start-local-head.sh)
unset RAY_API_SERVER_ADDRESS
# Every node runs its own agent, runtime-env agent and metrics exporter: on one machine the head holds Ray's default
# ports, so this node takes free ones (and its own temp dir: two raylets must not share session sockets).
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ports=(--dashboard-agent-listen-port "$(free_port)" --dashboard-agent-grpc-port "$(free_port)"
       --runtime-env-agent-port "$(free_port)" --metrics-export-port "$(free_port)")
rm -f "$state/worker.log"
# --block keeps `ray start` as the parent of this node's processes: stopping it stops exactly them.
nohup "$(dirname "$ray")/python" "$here/infra/ray/start_worker_node.py" start --address "127.0.0.1:$gcs" \
    --block --node-ip-address 127.0.0.1 --num-cpus "${2:-1}" \
    --temp-dir "/tmp/ray-$gcs-$name" --disable-usage-stats "${ports[@]}" > "$state/worker.log" 2>&1 &
echo $! > "$state/worker.pid"
# `ray start` says so once this node's raylet has registered with the head's GCS.
for _ in $(seq 120); do
    if grep -qs "Ray runtime started" "$state/worker.log"; then
        echo "Ray worker node $name up: ${2:-1} CPU(s), joined 127.0.0.1:$gcs (log: $state/worker.log)"
        exit 0
    fi
    kill -0 "$(cat "$state/worker.pid")" 2>/dev/null || break
    sleep 1
done
echo "the Ray worker node $name did not come up; see $state/worker.log" >&2
exit 1
