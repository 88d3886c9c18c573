#!/usr/bin/env bash
# Builds qhead's libFuzzer targets (fuzz/, CMake option QHEAD_FUZZ: clang,
# ASan + UBSan, no CUDA) and runs them.
#
#   scripts/fuzz.sh TARGET SECONDS   fuzz one target for SECONDS
#   scripts/fuzz.sh all SECONDS      each target in turn, SECONDS each
#   scripts/fuzz.sh regress          run every fuzz/regressions/<target>/* once
#   scripts/fuzz.sh build            only build
#
# Targets: safetensors gguf model_config shard_index gptq. Each run starts
# from the committed seeds (fuzz/corpus/<target>/, read only) plus a working
# corpus in the build directory, with the target's dictionary, -timeout=10
# (seconds per input), -rss_limit_mb=2048 and leak detection; it prints the
# execution count and rate at the end. A crash, hang, leak, out-of-memory or
# sanitizer report ends the run with a non-zero status and its reproducer in
# the findings directory (fuzz/findings/<target>/, not committed).
#
# Environment: QHEAD_FUZZ_BUILD (build directory, default build-fuzz),
# QHEAD_FUZZ_FINDINGS (default fuzz/findings), QHEAD_FUZZ_JOBS (N > 1: libFuzzer
# -fork=N worker processes), QHEAD_FUZZ_ARGS (extra libFuzzer flags; -runs=N stops
# after N executions), TMPDIR (the scratch directories; default /dev/shm where writable).
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(safetensors gguf model_config shard_index gptq)
build=${QHEAD_FUZZ_BUILD:-build-fuzz}
findings=${QHEAD_FUZZ_FINDINGS:-fuzz/findings}
jobs=${QHEAD_FUZZ_JOBS:-1}

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

build_targets() {
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only" \
      -DQHEAD_CUDA=OFF -DQHEAD_TESTS=OFF -DQHEAD_BENCHMARKS=OFF -DQHEAD_FUZZ=ON >/dev/null
  fi
  nice -n 10 cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null
}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
# The model-directory targets write each input to a file in a scratch directory
# under TMPDIR: in memory (/dev/shm) they run about 2.4x faster than on disk.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# fuzz_one TARGET SECONDS
fuzz_one() {
  local t=$1 secs=$2
  local bin="$build/fuzz/fuzz_$t" work="$build/corpus/$t" out="$findings/$t" log
  mkdir -p "$work" "$out"
  log=$(mktemp)
  local fork=()
  if [ "$jobs" -gt 1 ]; then fork=(-fork="$jobs"); fi
  local rc=0 start=$SECONDS
  # shellcheck disable=SC2086
  nice -n 15 "$bin" "${fork[@]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -detect_leaks=1 \
    -print_final_stats=1 -dict="fuzz/$t.dict" -artifact_prefix="$out/" ${QHEAD_FUZZ_ARGS:-} \
    "$work" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  # Executions: the final stats (one process) or the last status line (-fork).
  local execs rate took=$((SECONDS - start))
  execs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
  if [ -z "$execs" ]; then execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#' || true); fi
  rate=$(grep -oE '^stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
  if [ -z "$rate" ] && [ -n "$execs" ]; then rate=$((execs / (took > 0 ? took : 1))); fi
  if [ "$rc" != 0 ]; then
    tail -n 60 "$log"
    echo "qhead fuzz: $t: FINDING (exit $rc) after ${execs:-?} executions; reproducer in $out/" >&2
    rm -f "$log"
    return 1
  fi
  echo "qhead fuzz: $t: ${execs:-?} executions in ${took} s (${rate:-?} exec/s), no findings"
  rm -f "$log"
}

regress() {
  local failed=0 t files
  for t in "${targets[@]}"; do
    [ -d "fuzz/regressions/$t" ] || continue
    mapfile -t files < <(find "fuzz/regressions/$t" -type f | sort)
    [ "${#files[@]}" -gt 0 ] || continue
    if "$build/fuzz/fuzz_$t" -timeout=10 -rss_limit_mb=2048 -detect_leaks=1 "${files[@]}" >"$build/regress_$t.log" 2>&1; then
      echo "qhead fuzz: $t: ${#files[@]} regression inputs pass"
    else
      tail -n 60 "$build/regress_$t.log"
      echo "qhead fuzz: $t: a regression input fails (log: $build/regress_$t.log)" >&2
      failed=1
    fi
  done
  return $failed
}

[ $# -ge 1 ] || usage
case "$1" in
  build) build_targets ;;
  regress) build_targets; regress ;;
  all)
    [ $# -eq 2 ] || usage
    build_targets
    status=0
    for t in "${targets[@]}"; do fuzz_one "$t" "$2" || status=1; done
    exit $status ;;
  *)
    [ $# -eq 2 ] || usage
    printf '%s\n' "${targets[@]}" | grep -qx "$1" || { echo "unknown target '$1' (${targets[*]})" >&2; exit 2; }
    build_targets
    fuzz_one "$1" "$2" ;;
esac
