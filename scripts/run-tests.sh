#!/usr/bin/env bash
# Builds qhead twice and runs every test in both builds, then fuzzes:
#   build/       Release (CUDA when nvcc is present)
#   build-asan/  Debug with AddressSanitizer + UndefinedBehaviorSanitizer
#   build-fuzz/  the libFuzzer targets (clang, ASan + UBSan): every past
#                reproducer in fuzz/regressions/ once, then each target for
#                QHEAD_FUZZ_SECONDS (default 35) from the committed seeds;
#                any crash, hang, leak or sanitizer report fails the run
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
QHEAD_FUZZ_BUILD=build-fuzz scripts/fuzz.sh regress
QHEAD_FUZZ_BUILD=build-fuzz scripts/fuzz.sh all "${QHEAD_FUZZ_SECONDS:-35}"
echo "qhead: all tests passed (Release and ASan/UBSan), fuzz targets clean"
