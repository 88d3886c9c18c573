#!/usr/bin/env bash
# CPU peer benchmark: qhead's CPU bench against llama.cpp's ggml mul_mat on the
# same shapes, M and thread count, in one JSON document.
#
#   1. fetches the llama-cpp-python 0.3.36 source package from PyPI (it vendors
#      llama.cpp and its ggml) into a cache, checks its sha256, extracts it;
#   2. builds ggml's CPU backend (Release, native ISA, static, no BLAS) and
#      tools/peers/ggml_bench.cc against it into build-peers/;
#   3. runs `qhead bench --device cpu --json` (the CLI of the normal build; this
#      script does not build qhead), then ggml_bench --json, with the same
#      --shape, --m, --threads and --reps;
#   4. writes one bench file (scripts/perf_report.py's envelope: "qhead",
#      "device", "command", "date", "rows"; "tool": "bench_llamacpp"): qhead's
#      rows as its bench wrote them, then each ggml row with path
#      "ggml_<type>_<layout>" and "peer": "ggml"; "layout" is "plain" (ggml's
#      block layout) or "repacked" (the CPU backend's extra buffer type, e.g.
#      CPU_REPACK, as llama.cpp loads it).
#
# Usage: scripts/bench_llamacpp.sh [--shape VxH[,..]] [--m 1,8] [--threads N]
#                                  [--reps N] [--isa auto|avx2|avx512] [--out FILE]
#   --shape    default: qhead bench's five real-model shapes (4 distinct VxH)
#   --m        default 1,8
#   --threads  default: nproc
#   --reps     timed calls per row (default: each tool's auto rule)
#   --isa      qhead's CPU kernel path (qhead bench --isa; default: the best this CPU has)
#   --out      default: stdout
#
# Environment: QHEAD_CLI (default build/qhead), QHEAD_PEER_CACHE (default
# ~/.cache/qhead/peers), PYTHON (default python3), CMAKE_BUILD_PARALLEL_LEVEL.
# Needs python3 with pip, cmake, a C/C++ compiler, sha256sum, tar.
set -euo pipefail

LCPP_VERSION=0.3.36
LCPP_TARBALL="llama_cpp_python-${LCPP_VERSION}.tar.gz"
LCPP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# qhead bench's default shapes (tests/cases.h bench_shapes), deduplicated.
DEFAULT_SHAPES="151936x1024,50304x512,128256x4096,262144x640"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${QHEAD_PEER_CACHE:-$HOME/.cache/qhead/peers}"
PY="${PYTHON:-python3}"
CLI="${QHEAD_CLI:-$REPO/build/qhead}"
BUILD="$REPO/build-peers"

die() { echo "bench_llamacpp: $*" >&2; exit 1; }

COMMAND="$(printf '%q ' "$0" "$@")"
COMMAND="${COMMAND% }"

shape="" m="1,8" threads="" reps="" out="" isa=""
while [ $# -gt 0 ]; do
  case "$1" in
    --shape|--m|--threads|--reps|--out|--isa)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in
        --shape) shape="$2" ;; --m) m="$2" ;; --threads) threads="$2" ;;
        --reps) reps="$2" ;; --out) out="$2" ;; --isa) isa="$2" ;;
      esac
      shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
threads="${threads:-$(nproc)}"
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || die "--threads '$threads' must be a positive integer"
[ -z "$reps" ] || [[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "--reps '$reps' must be a positive integer"

[ -x "$CLI" ] || die "no qhead CLI at $CLI: build qhead first (cmake --build build) or set QHEAD_CLI"

# 1. The source package, checked and extracted once.
mkdir -p "$CACHE" || die "cannot create $CACHE"
if [ ! -f "$CACHE/$LCPP_TARBALL" ]; then
  echo "bench_llamacpp: fetching llama-cpp-python==$LCPP_VERSION (source) into $CACHE" >&2
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$LCPP_VERSION" -d "$CACHE" >&2 || die "pip download of llama-cpp-python==$LCPP_VERSION failed"
  [ -f "$CACHE/$LCPP_TARBALL" ] || die "pip download left no $CACHE/$LCPP_TARBALL"
fi
got="$(sha256sum "$CACHE/$LCPP_TARBALL" | cut -d' ' -f1)"
[ "$got" = "$LCPP_SHA256" ] || die "$CACHE/$LCPP_TARBALL: sha256 $got, expected $LCPP_SHA256 (delete it to fetch again)"
SRC="$CACHE/llama_cpp_python-$LCPP_VERSION"
GGML_SRC="$SRC/vendor/llama.cpp/ggml"
if [ ! -f "$GGML_SRC/CMakeLists.txt" ]; then
  tmp="$(mktemp -d "$CACHE/extract.XXXXXX")"
  tar -xzf "$CACHE/$LCPP_TARBALL" -C "$tmp" || { rm -rf "$tmp"; die "cannot extract $LCPP_TARBALL"; }
  rm -rf "$SRC"
  mv "$tmp/llama_cpp_python-$LCPP_VERSION" "$SRC"
  rm -rf "$tmp"
  [ -f "$GGML_SRC/CMakeLists.txt" ] || die "$LCPP_TARBALL has no vendor/llama.cpp/ggml"
fi

# 2. ggml (CPU backend only) and the peer bench.
mkdir -p "$BUILD" || die "cannot create $BUILD"
cmake -S "$REPO/tools/peers" -B "$BUILD" -DGGML_SRC="$GGML_SRC" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DGGML_OPENMP=ON >"$BUILD/configure.log" 2>&1 \
  || { cat "$BUILD/configure.log" >&2; die "configuring ggml failed"; }
cmake --build "$BUILD" --target ggml_bench -j "${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" >"$BUILD/build.log" 2>&1 \
  || { tail -40 "$BUILD/build.log" >&2; die "building ggml / ggml_bench failed"; }
rm -f "$BUILD/configure.log" "$BUILD/build.log"

# 3. qhead, then ggml, on the same shapes, M, threads and reps.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
qargs=(bench --device cpu --json --m "$m" --threads "$threads")
gargs=(--json --m "$m" --threads "$threads" --shape "${shape:-$DEFAULT_SHAPES}")
[ -z "$shape" ] || qargs+=(--shape "$shape")
[ -z "$isa" ] || qargs+=(--isa "$isa")
[ -z "$reps" ] || { qargs+=(--reps "$reps"); gargs+=(--reps "$reps"); }

echo "bench_llamacpp: $CLI ${qargs[*]}" >&2
"$CLI" "${qargs[@]}" >"$work/qhead.json" || die "qhead bench failed"
echo "bench_llamacpp: ggml_bench ${gargs[*]}" >&2
"$BUILD/ggml_bench" "${gargs[@]}" >"$work/ggml.json" \
  || die "ggml_bench failed (a peer whose output fails its check is not timed)"

# 4. One self-describing document.
commit="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty=false
[ -z "$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null)" ] || dirty=true
cpu="$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/^[^:]*: *//')"

"$PY" - "$work/qhead.json" "$work/ggml.json" "$commit" "$dirty" "$COMMAND" "${cpu:-unknown}" "$threads" \
  "$LCPP_VERSION" "$out" <<'EOF'
import datetime, json, sys

qhead_path, ggml_path, commit, dirty, command, cpu, threads, lcpp, out = sys.argv[1:]
with open(qhead_path) as f:
    qhead = json.load(f)
with open(ggml_path) as f:
    ggml = json.load(f)
for row in ggml:
    row["llama_cpp_python_version"] = lcpp
# The envelope of a bench file (scripts/perf_report.py): qhead's rows as its
# bench wrote them, then one row per ggml measurement, path "ggml_<type>_<layout>".
rows = list(qhead["rows"])
for g in ggml:
    row = dict(g)
    row["path"] = f"ggml_{g.get('type')}_{g.get('layout', 'plain')}"
    row["scheme"] = g.get("type")
    rows.append(row)
device = dict(qhead.get("device", {}))
device.update({"name": cpu, "threads": int(threads), "llama_cpp_python": lcpp})
doc = {
    "tool": "bench_llamacpp",
    "qhead": qhead.get("qhead", {"version": "unknown", "commit": commit}),
    "device": device,
    "command": command,
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "dirty": dirty == "true",
    "rows": rows,
}
text = json.dumps(doc, indent=2) + "\n"
if out:
    with open(out, "w") as f:
        f.write(text)
else:
    sys.stdout.write(text)
EOF
[ -z "$out" ] || echo "bench_llamacpp: wrote $out" >&2
