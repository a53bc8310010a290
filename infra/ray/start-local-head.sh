#!/usr/bin/env bash
# A local Ray head on 127.0.0.1 (GCS on 6390, dashboard / job API on 8265), for `ppdkit submit`.
# Usage: infra/ray/start-local-head.sh [NUM_CPUS]      then: ppdkit submit job.yaml --address http://127.0.0.1:8265
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
ray="${RAY:-$here/.venv/bin/ray}"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
# Ray turns token auth on once ~/.ray/auth_token exists; server and clients must agree (see README).
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
"$ray" start --head --port 6390 --node-ip-address 127.0.0.1 --dashboard-host 127.0.0.1 --dashboard-port 8265 \
    --num-cpus "${1:-$(nproc)}" --disable-usage-stats
echo "Ray head up: dashboard and job API at http://127.0.0.1:8265"
