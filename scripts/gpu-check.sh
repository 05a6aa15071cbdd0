#!/usr/bin/env bash
# Every GPU check of copse in one go, for a machine with an NVIDIA GPU: builds (scripts/dev.sh
# build), then runs the CUDA suite (every Device op, whole training steps and bfloat16 against
# the CPU), the NCCL channel suite, and the GPU benches (the MLP against PyTorch CUDA, fp32
# against bf16), each under a time limit, and prints one summary. About 5 minutes on an H100.
# Run it whenever a GPU is available and record its figures, with the date and the card, in
# docs/benchmarks.md. Without a GPU it says so and exits 0: nothing could run.
#
#   scripts/gpu-check.sh            # COPSE_BUILD_DIR as scripts/dev.sh
set -uo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${COPSE_BUILD_DIR:-${src}-build}"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi finds none): nothing to run"
  exit 0
fi
nvidia-smi -L
bash "$src/scripts/dev.sh" build >/dev/null || { echo "gpu-check: the build failed"; exit 1; }

summary=()
failed=0
# run NAME SECONDS COMMAND...: runs with a time limit, keeps its output in $build/gpu-check/NAME.txt
run() {
  local name=$1 limit=$2
  shift 2
  mkdir -p "$build/gpu-check"
  local log="$build/gpu-check/$name.txt" start=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local verdict="ok"
  if ((rc == 77)); then
    verdict="skipped (no GPU for it)"
  elif ((rc == 124 || rc == 137)); then
    verdict="TIMED OUT after ${limit}s"
    failed=1
  elif ((rc != 0)); then
    verdict="FAILED (exit $rc)"
    failed=1
  fi
  summary+=("$(printf '%-22s %-26s %4ds  %s' "$name" "$verdict" $((SECONDS - start)) "$log")")
  echo "== $name: $verdict"
  tail -n 12 "$log"
}

run cuda-suite 180 "$build/tests/ml/cuda/ml_cuda_tests"
run nccl-suite 120 ctest --test-dir "$build" -R '^channels_nccl$' --output-on-failure
run mlp-vs-torch 120 "$build/bench/ml_train_bench" --device cuda --model mlp --runs 3
run fp32-vs-bf16 150 "$build/bench/mixed_precision_bench" --device cuda --runs 3

echo
echo "gpu-check summary ($(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)):"
printf '  %s\n' "${summary[@]}"
exit $failed
