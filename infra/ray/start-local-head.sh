#!/usr/bin/env bash
# A local Ray head on 127.0.0.1 (GCS on $RAY_GCS_PORT or 6390, job API on $RAY_DASHBOARD_PORT or 8265),
# for `ppdkit submit`. It runs in the background; stop-local-head.sh stops this head and nothing else.
# Usage: infra/ray/start-local-head.sh [NUM_CPUS]      then: ppdkit submit job.yaml --address http://127.0.0.1:8265
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
ray="${RAY:-$here/.venv/bin/ray}"
gcs="${RAY_GCS_PORT:-6390}" dash="${RAY_DASHBOARD_PORT:-8265}"
state="${PPDKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ppdkit}/ray-head-$dash"
mkdir -p "$state"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0  # bind to 127.0.0.1 only
# Ray turns token auth on once ~/.ray/auth_token exists; server and clients must agree (docs/clusters.md).
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
# Processes of an embedded Ray (ppdkit's own, ppdkit/jobs/ray_session.py) carry that Ray's state-API address:
# this head's processes must not inherit it.
unset RAY_API_SERVER_ADDRESS
# Another Ray on this machine (an embedded one included) holds the agent's default ports (52365 ...);
# the job API needs its agent, so these can be moved: RAY_AGENT_PORT, RAY_AGENT_GRPC_PORT,
# RAY_RUNTIME_ENV_AGENT_PORT, RAY_METRICS_PORT.
ports=()
[ -n "${RAY_AGENT_PORT:-}" ] && ports+=(--dashboard-agent-listen-port "$RAY_AGENT_PORT")
[ -n "${RAY_AGENT_GRPC_PORT:-}" ] && ports+=(--dashboard-agent-grpc-port "$RAY_AGENT_GRPC_PORT")
[ -n "${RAY_RUNTIME_ENV_AGENT_PORT:-}" ] && ports+=(--runtime-env-agent-port "$RAY_RUNTIME_ENV_AGENT_PORT")
[ -n "${RAY_METRICS_PORT:-}" ] && ports+=(--metrics-export-port "$RAY_METRICS_PORT")
# --block keeps `ray start` as the parent of this head's processes: stopping it stops exactly them.
nohup "$ray" start --head --block --port "$gcs" --node-ip-address 127.0.0.1 --dashboard-host 127.0.0.1 \
    --dashboard-port "$dash" --num-cpus "${1:-$(nproc)}" --disable-usage-stats "${ports[@]}" \
    > "$state/head.log" 2>&1 &
echo $! > "$state/head.pid"
# The job API answers before its agent is up, and a job submitted then is refused or dropped:
# wait for both the dashboard and the head node's agent.
agent="${RAY_AGENT_PORT:-52365}"
for _ in $(seq 180); do
    if curl -sf "http://127.0.0.1:$dash/api/version" > /dev/null \
        && curl -sf "http://127.0.0.1:$agent/api/healthz" > /dev/null; then
        echo "Ray head up: job API at http://127.0.0.1:$dash (log: $state/head.log)"
        exit 0
    fi
    kill -0 "$(cat "$state/head.pid")" 2>/dev/null || break
    sleep 1
done
echo "the Ray head did not come up; see $state/head.log" >&2
exit 1
