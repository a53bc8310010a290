#!/usr/bin/env bash
# `make setup-llama`: llama-cpp-python (the bench's llama.cpp peer) built from source for this CPU, then run once.
# usage: install.sh PYTHON
# --no-cache-dir: pip would otherwise reuse a wheel it built earlier with other CMAKE_ARGS (seen on a CI machine: a
# GCC build with the AMX kernels, which crash on any prompt, stood in for the clang build). The run (ppdkit/bench/llama_cpp.py
# check_build: a 32-token prompt through its kernels) catches a build that crashes here; then it is built again
# without its AMX kernels (about half as fast on an AMX CPU) and run again, and only a second crash fails the target.
set -euo pipefail
python="$1"
here="$(dirname "$0")"
# -DLLAVA_BUILD=OFF: llama-cpp-python's multimodal library (tools/mtmd), 51 of the build's 178 objects, which ppdkit
# never loads: CI builds this on 2 cores, where the whole install took 570 s with it and 488 s without
build() {
    CMAKE_ARGS="$(bash "$here/cmake_args.sh" "$@") -DLLAVA_BUILD=OFF" "$python" -m pip install --quiet --no-cache-dir \
        -e ".[llama]"
}
build
if "$python" -m ppdkit.bench.llama_cpp; then
    exit 0
fi
if ! grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    exit 1
fi
echo "setup-llama: rebuilding llama.cpp without its AMX kernels, since the AMX build crashed here" >&2
"$python" -m pip uninstall --quiet -y llama-cpp-python
build --no-amx
"$python" -m ppdkit.bench.llama_cpp
