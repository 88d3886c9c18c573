#!/usr/bin/env bash
# Builds qhead and runs the main job: `qhead demo` (quantize a deterministic
# Qwen3-0.6B-shaped table to w4g64, inspect it, check every op).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
./build/qhead demo "$@"
