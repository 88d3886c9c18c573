#!/usr/bin/env bash
# Installs qhead's build and test dependencies from Debian's packages.
# Safe to run repeatedly; skips apt-get when everything is already present.
set -euo pipefail
# clang + libclang-rt-14-dev: the libFuzzer targets (scripts/fuzz.sh, the third stage of scripts/run-tests.sh).
pkgs=(cmake g++ make pkg-config libgtest-dev nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev libre2-dev clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
