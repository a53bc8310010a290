#!/usr/bin/env bash
# The CMake arguments `make setup-llama` builds llama.cpp (llama-cpp-python, the bench's peer) with, for this CPU.
# Always the native build (-march=native: AVX-512, VNNI, BF16 where the CPU has them). On a CPU with AMX-INT8 its
# AMX kernels are its fast path (208-214 against about 95 tok/s for its VNNI path on SmolLM2's Q4_1, measured on a
# 2-core AMX VM), but with GCC 12 they segfault on any batch of 2+ tokens: GCC 12 declares `_tile_loadconfig` as an
# 8-byte read, so the stores that fill the 64-byte tile configuration can be dropped (llama.cpp issue 20824). So on
# such a CPU we build with clang when it and its OpenMP runtime are installed (`apt-get install clang libomp-dev`),
# defining __AMX_INT8__ because clang 14 spells it __AMXINT8__ and the AMX code would otherwise be compiled out;
# without clang the GCC build leaves the AMX kernels out (they would crash) and says so on stderr.
# --no-amx: leave the AMX kernels out whatever the compiler (install.sh's second try, where the AMX build crashed).
set -euo pipefail
args="-DGGML_NATIVE=ON"
no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [ "${1:-}" = "--no-amx" ]; then
    echo "$args -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'"
    exit 0
fi
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    if command -v clang >/dev/null && command -v clang++ >/dev/null \
        && ls /usr/lib/llvm-*/lib/libomp.so >/dev/null 2>&1; then
        args="$args -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++"
        args="$args -DCMAKE_C_FLAGS=-D__AMX_INT8__=1 -DCMAKE_CXX_FLAGS=-D__AMX_INT8__=1"
    else
        # GCC's native build would compile the AMX kernels too (-march=native defines __AMX_INT8__) and crash on
        # the first batch (seen: a general protection fault in libggml-cpu): leave the tiles out of it
        args="$args -DCMAKE_C_FLAGS='$no_amx' -DCMAKE_CXX_FLAGS='$no_amx'"
        echo "setup-llama: this CPU has AMX-INT8, but llama.cpp's AMX kernels need clang and libomp" \
             "(apt-get install clang libomp-dev; GCC 12 miscompiles them): building its GCC native build" \
             "without them (its VNNI path, about half as fast)" >&2
    fi
fi
echo "$args"
