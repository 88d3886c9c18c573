#!/usr/bin/env bash
# Builds qhead twice and runs every test in both builds:
#   build/       Release (CUDA when nvcc is present)
#   build-asan/  Debug with AddressSanitizer + UndefinedBehaviorSanitizer
# GPU tests skip themselves when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DQHEAD_TESTS=ON
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DQHEAD_SANITIZE=ON -DQHEAD_CUDA=OFF -DQHEAD_TESTS=ON
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"
echo "qhead: all tests passed (Release and ASan/UBSan)"
