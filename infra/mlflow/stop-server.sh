#!/usr/bin/env bash
set -euo pipefail
store="${PPDKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ppdkit}/mlflow-server"
[ -f "$store/server.pid" ] && kill "$(cat "$store/server.pid")" 2>/dev/null || true
rm -f "$store/server.pid"
