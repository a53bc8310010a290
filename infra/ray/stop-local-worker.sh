#!/usr/bin/env bash
# Stop the worker node NAME started by add-local-worker.sh, and only it.
set -euo pipefail
name="${1:?usage: stop-local-worker.sh NAME}"
state="${PPDKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ppdkit}/ray-worker-$name"
[ -f "$state/worker.pid" ] || { echo "no worker node $name recorded in $state"; exit 0; }
source "$(dirname "$0")/stop_ray_start.sh"
stop_ray_start "$state/worker.pid"
rm -rf "/tmp/ray-${RAY_GCS_PORT:-6390}-$name"  # its Ray temp dir (add-local-worker.sh)
echo "Ray worker node $name stopped"
