#!/usr/bin/env bash
# Builds qhead twice and runs every test in both builds, then fuzzes:
#   build/       Release (CUDA when nvcc is present) with the Python extension;
#                then the installed library is checked (scripts/check-install.sh),
#                the Python package is installed from this build into the venv
#                (scripts/setup-python.sh) and python/tests run with pytest
#   build-asan/  Debug with AddressSanitizer + UndefinedBehaviorSanitizer
#   build-fuzz/  the libFuzzer targets (clang, ASan + UBSan): every past
#                reproducer in fuzz/regressions/ once, then each target for
#                QHEAD_FUZZ_SECONDS (default 35) from the committed seeds;
#                any crash, hang, leak or sanitizer report fails the run
# GPU tests skip themselves when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-deps.sh
PY="$(scripts/setup-python.sh)"
scripts/check_words.sh   # the project speaks only of itself (no session/issue/version history)
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DQHEAD_TESTS=ON -DQHEAD_PYTHON=ON -DPython_EXECUTABLE="$PY"
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
scripts/check-install.sh build
# The package from the same build tree (its generator; only the extension
# module is new).
CMAKE_GENERATOR="Unix Makefiles" "$PY" -m pip install --disable-pip-version-check --no-build-isolation --no-deps -q \
  -Cbuild-dir=build -Ccmake.define.QHEAD_TESTS=ON .
(cd python/tests && "$PY" -c "import qhead, qhead.torch, qhead.hf; print('qhead', qhead.__version__, 'from', qhead.__file__)")
scripts/fetch_models.sh || echo "qhead: the real models could not be fetched; their tests skip"
HF_HUB_OFFLINE=1 QHEAD_CLI="$PWD/build/qhead" "$PY" -m pytest -q -rs python/tests
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DQHEAD_SANITIZE=ON -DQHEAD_CUDA=OFF -DQHEAD_TESTS=ON
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"
QHEAD_FUZZ_BUILD=build-fuzz scripts/fuzz.sh regress
QHEAD_FUZZ_BUILD=build-fuzz scripts/fuzz.sh all "${QHEAD_FUZZ_SECONDS:-35}"
echo "qhead: all tests passed (Release, the installed library, Python, ASan/UBSan), fuzz targets clean"
