#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, torch and the Python build tools already
# installed (nanobind, scikit-build-core, pytest): builds qhead with CUDA
# for the GPU present, runs the C++ tests, installs the Python package from
# the same build, runs python/tests and the binding benchmark. Results and
# logs go to OUT_DIR (default ./gpu-out).
#
#   scripts/gpu-check.sh [OUT_DIR]        env: PYTHON (default python3), CUDA_ARCH (default 90a-real)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-gpu-out}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
ARCH="${CUDA_ARCH:-90a-real}"
jobs=$(nproc)
status=0
step() { echo "== $*"; }

step "configure + build (CUDA $ARCH)"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DQHEAD_TESTS=ON -DQHEAD_PYTHON=ON \
      -DPython_EXECUTABLE="$(command -v "$PY")" -DCMAKE_CUDA_ARCHITECTURES="$ARCH" > "$OUT_DIR/configure.log" 2>&1 \
  && cmake --build build-gpu -j"$jobs" > "$OUT_DIR/build.log" 2>&1 || { tail -40 "$OUT_DIR/build.log"; exit 1; }

step "C++ tests"
ctest --test-dir build-gpu -j4 --output-on-failure > "$OUT_DIR/ctest.log" 2>&1 || status=1
grep -E "tests passed|tests failed|\(Failed\)" "$OUT_DIR/ctest.log"

step "installed library"
scripts/check-install.sh build-gpu > "$OUT_DIR/check-install.log" 2>&1 || status=1
tail -3 "$OUT_DIR/check-install.log"

step "Python package"
CMAKE_GENERATOR="Unix Makefiles" "$PY" -m pip install --disable-pip-version-check --no-build-isolation --no-deps -q \
      -Cbuild-dir=build-gpu -Ccmake.define.QHEAD_TESTS=ON -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$ARCH" . \
      > "$OUT_DIR/pip.log" 2>&1 || { tail -30 "$OUT_DIR/pip.log"; exit 1; }
HF_HUB_OFFLINE=1 QHEAD_CLI="$PWD/build-gpu/qhead" "$PY" -m pytest -q -rs python/tests > "$OUT_DIR/pytest.log" 2>&1 || status=1
tail -25 "$OUT_DIR/pytest.log"

step "binding overhead"
if [ -f scripts/bench_binding.py ]; then
  "$PY" scripts/bench_binding.py --device cuda --json "$OUT_DIR/bench_binding_cuda.json" > "$OUT_DIR/bench_binding.log" 2>&1 || status=1
  tail -20 "$OUT_DIR/bench_binding.log"
fi
exit $status
