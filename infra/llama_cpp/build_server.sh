#!/usr/bin/env bash
# `make setup-llama-server`: llama.cpp's own `llama-server` (the peer `ppdkit serve-bench` drives with parallel slots)
# and `llama-bench` (its batched step costs, beside ppdkit's in docs/tools/step_costs.py), built from the llama.cpp source vendored in the llama-cpp-python sdist that `make setup-llama` builds, so both peers
# are the same llama.cpp, with the same CMake arguments for this CPU (cmake_args.sh: the native build, clang for its
# AMX kernels where the CPU has them). About 4 minutes on 2 cores.
# usage: build_server.sh PYTHON
# Writes $PPDKIT_CACHE/llama.cpp/llama-cpp-python-VERSION/bin/llama-server and llama-bench, and convert/ (its GGUF
# converter)
# (ppdkit/bench/serving_backends.py looks there): static binaries (no shared libraries beside it), no web UI (its prebuilt assets come from a model hub,
# which the build must not need), no curl or OpenSSL (the server loads a local file and serves plain HTTP).
set -euo pipefail
python="$1"
here="$(cd "$(dirname "$0")" && pwd)"
version="$(grep -o 'llama-cpp-python==[0-9.]*' "$here/../../pyproject.toml" | head -1 | cut -d= -f3)"
dest="$("$python" -c 'from ppdkit.models.paths import cache_dir; print(cache_dir())')/llama.cpp/llama-cpp-python-$version"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
tar xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
source="$work/llama_cpp_python-$version/vendor/llama.cpp"
eval "native=($(bash "$here/cmake_args.sh" "$@"))"  # its quoted flags split as pip splits CMAKE_ARGS
cmake -S "$source" -B "$work/build" -DCMAKE_BUILD_TYPE=Release "${native[@]}" -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF > "$work/configure.log" || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server llama-bench -j "$(nproc)" > "$work/build.log" \
    || { tail -50 "$work/build.log" >&2; exit 1; }
mkdir -p "$dest/bin"
for tool in llama-bench llama-server; do  # llama-server last: its presence says the build is whole
    install -m 755 "$work/build/bin/$tool" "$dest/bin/$tool.partial"
    mv "$dest/bin/$tool.partial" "$dest/bin/$tool"
done
# llama.cpp's GGUF converter from the same source (`ppdkit export --format gguf`: ppdkit/models/gguf_export.py), with
# the gguf package it is written against
rm -rf "$dest/convert.partial"
mkdir -p "$dest/convert.partial"
cp -r "$source/convert_hf_to_gguf.py" "$source/conversion" "$source/gguf-py" "$dest/convert.partial/"
rm -rf "$dest/convert"
mv "$dest/convert.partial" "$dest/convert"
"$dest/bin/llama-server" --version 2>&1 | tail -2
echo "setup-llama-server: wrote $dest/bin/llama-server and llama-bench"
