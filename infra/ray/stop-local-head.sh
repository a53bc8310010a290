#!/usr/bin/env bash
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
"${RAY:-$here/.venv/bin/ray}" stop --force
