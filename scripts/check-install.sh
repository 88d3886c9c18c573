#!/usr/bin/env bash
# Installs a configured build into a temporary prefix and builds
# tests/install/consumer.cc against it the two ways a user would: with CMake
# (find_package(qhead), target qhead::qhead) and with pkg-config (qhead).
# Both programs must run and pass, and the CPU-only ones must link no CUDA
# library. From a build with CUDA, the same is done with qhead::cuda /
# qhead-cuda (the program then runs on the CPU when no GPU is visible).
#
#   scripts/check-install.sh BUILD_DIR
set -euo pipefail
BUILD="${1:?usage: scripts/check-install.sh BUILD_DIR}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PREFIX="$WORK/prefix"

cmake --install "$BUILD" --prefix "$PREFIX" --component dev > "$WORK/install.log"
echo "check-install: installed $(find "$PREFIX" -type f | wc -l) files (headers, libraries, CMake package, pkg-config)"

# no_cuda PROGRAM: fails when PROGRAM needs or contains a CUDA library.
no_cuda() {
  if readelf -d "$1" | grep -E 'NEEDED.*(cuda|cublas|nccl)' || nm "$1" | grep -q -E ' [TtDd] cudaMalloc$'; then
    echo "check-install: $1 links a CUDA library" >&2
    return 1
  fi
}

cmake -S "$ROOT/tests/install" -B "$WORK/cmake-cpu" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release > "$WORK/cmake-cpu.log"
cmake --build "$WORK/cmake-cpu" > "$WORK/build-cpu.log"
"$WORK/cmake-cpu/consumer"
no_cuda "$WORK/cmake-cpu/consumer"

PKG_CONFIG_PATH="$(dirname "$(find "$PREFIX" -name qhead.pc)")"
export PKG_CONFIG_PATH
# shellcheck disable=SC2046
g++ -O2 -o "$WORK/pc-cpu" "$ROOT/tests/install/consumer.cc" $(pkg-config --cflags --libs qhead)
"$WORK/pc-cpu"
no_cuda "$WORK/pc-cpu"
echo "check-install: CPU library: CMake package and pkg-config consumers pass and link no CUDA library"

if [ -f "$PKG_CONFIG_PATH/qhead-cuda.pc" ]; then
  cmake -S "$ROOT/tests/install" -B "$WORK/cmake-cuda" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release \
        -DQHEAD_CONSUMER_CUDA=ON > "$WORK/cmake-cuda.log"
  cmake --build "$WORK/cmake-cuda" > "$WORK/build-cuda.log"
  "$WORK/cmake-cuda/consumer"
  # shellcheck disable=SC2046
  g++ -O2 -o "$WORK/pc-cuda" "$ROOT/tests/install/consumer.cc" $(pkg-config --cflags --libs qhead-cuda)
  "$WORK/pc-cuda"
  echo "check-install: CUDA library: CMake package and pkg-config consumers pass"
fi
echo "check-install: passed"
