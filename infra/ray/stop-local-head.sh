#!/usr/bin/env bash
# Stop the head started by start-local-head.sh (same RAY_DASHBOARD_PORT), and only it.
set -euo pipefail
dash="${RAY_DASHBOARD_PORT:-8265}"
state="${PPDKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ppdkit}/ray-head-$dash"
[ -f "$state/head.pid" ] || { echo "no head recorded in $state"; exit 0; }
source "$(dirname "$0")/stop_ray_start.sh"
stop_ray_start "$state/head.pid"
# `ray start` records the head for later `ray.init()` calls; forget it if it is this head
current="${TMPDIR:-/tmp}/ray/ray_current_cluster"
if [ -f "$current" ] && grep -q ":${RAY_GCS_PORT:-6390}\$" "$current"; then rm -f "$current"; fi
echo "Ray head on port $dash stopped"
