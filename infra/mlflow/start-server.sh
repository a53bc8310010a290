#!/usr/bin/env bash
# An MLflow tracking server on 127.0.0.1:5000 with a sqlite backend and artifacts under the cache dir.
# Usage: infra/mlflow/start-server.sh [PORT]     then: export MLFLOW_TRACKING_URI=http://127.0.0.1:5000
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
port="${1:-5000}"
store="${PPDKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ppdkit}/mlflow-server"
mkdir -p "$store/artifacts"
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false MLFLOW_DISABLE_TELEMETRY=true
nohup "${MLFLOW:-$here/.venv/bin/mlflow}" server --backend-store-uri "sqlite:///$store/mlflow.db" \
    --artifacts-destination "$store/artifacts" --serve-artifacts \
    --host 127.0.0.1 --port "$port" --workers 1 > "$store/server.log" 2>&1 &
echo $! > "$store/server.pid"
for _ in $(seq 60); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && { echo "MLflow at http://127.0.0.1:$port"; exit 0; }
    sleep 1
done
echo "MLflow did not come up; see $store/server.log" >&2
exit 1
