#!/usr/bin/env bash
# A local Ray head on 127.0.0.1 (GCS on $RAY_GCS_PORT or 6390, job API on $RAY_DASHBOARD_PORT or 8265).
# Usage: infra/ray/start-local-head.sh [NUM_CPUS]      then: ppdkit submit job.yaml --address http://127.0.0.1:8265
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
ray="${RAY:-$here/.venv/bin/ray}"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
# Ray turns token auth on once ~/.ray/auth_token exists; server and clients must agree (see README).
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
gcs="${RAY_GCS_PORT:-6390}" dash="${RAY_DASHBOARD_PORT:-8265}"
"$ray" start --head --port "$gcs" --node-ip-address 127.0.0.1 --dashboard-host 127.0.0.1 --dashboard-port "$dash" \
    --num-cpus "${1:-$(nproc)}" --disable-usage-stats
echo "Ray head up: dashboard and job API at http://127.0.0.1:$dash"
