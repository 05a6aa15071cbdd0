#!/usr/bin/env bash
# Every GPU check of copse in one go, for a machine with an NVIDIA GPU: builds (scripts/dev.sh
# build), then runs the CUDA suite (every Device op, whole training steps and bfloat16 against
# the CPU), the NCCL channel suite, the GPU training-graph suite (copse graph --device cuda
# against the CPU), and the GPU benches (the MLP against PyTorch CUDA, fp32 against bf16,
# training graphs on the GPU), each under a time limit, and prints one summary. About 5 minutes
# on an H100. Run it whenever a GPU is available and record its figures, with the date and the
# card, in docs/benchmarks.md. Without a GPU it says so and exits 0: nothing could run.
#
#   scripts/gpu-check.sh                              # COPSE_BUILD_DIR as scripts/dev.sh
#   scripts/gpu-check.sh --bundle .gpu/bundle.tar.xz  # no build: what scripts/gpu-bundle.sh packed
#
# --bundle is for a GPU machine without copse's Debian packages (a lent one, with no network):
# the bundle's programs, libraries and datasets are unpacked at the absolute paths they were
# built for, and the CUDA libraries they need are looked up on that machine.
set -uo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${COPSE_BUILD_DIR:-${src}-build}"
bundle=""
if [[ "${1:-}" == "--bundle" ]]; then
  bundle="$(realpath "$2")"
fi

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU here (nvidia-smi finds none): nothing to run"
  exit 0
fi
nvidia-smi -L
if [[ -n "$bundle" ]]; then
  tar -xJf "$bundle" --absolute-names -C / || { echo "gpu-check: cannot unpack $bundle"; exit 1; }
  built_src="$(cat "$(tar -tJf "$bundle" --absolute-names | grep '/.gpu-source$')")"
  build="$(dirname "$(tar -tJf "$bundle" --absolute-names | grep '/.gpu-source$')")"
  # The programs know their source directory by the path they were built in.
  if [[ "$built_src" != "$src" && ! -e "$built_src" ]]; then
    mkdir -p "$(dirname "$built_src")" && ln -s "$src" "$built_src"
  fi
  export LD_LIBRARY_PATH="$build/.gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # CUDA's libraries (cuBLAS, NCCL, the runtime) from that machine: wherever a missing one is.
  for lib in $(ldd "$build/tests/ml/cuda/ml_cuda_tests" "$build/tests/channels/nccl/channels_nccl_tests" |
    awk '/not found/ {print $1}' | sort -u); do
    found="$(find /usr/local /usr/lib /opt -name "$lib" 2>/dev/null | head -n 1)"
    [[ -n "$found" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
  done
  still="$(ldd "$build/cli/copse" "$build/tests/ml/cuda/ml_cuda_tests" "$build/tests/channels/nccl/channels_nccl_tests" |
    awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')"
  [[ -z "$still" ]] || echo "gpu-check: libraries not found on this machine: $still"
  export COPSE_PYTHON="${COPSE_PYTHON:-$(command -v python3)}"  # the one with PyTorch there
else
  bash "$src/scripts/dev.sh" build >/dev/null || { echo "gpu-check: the build failed"; exit 1; }
fi

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
run nccl-suite 120 "$build/tests/channels/nccl/channels_nccl_tests"
run graph-suite 300 "$build/tests/ml_graph_cuda/ml_graph_cuda_tests"
run mlp-vs-torch 120 "$build/bench/ml_train_bench" --device cuda --model mlp --runs 3
run fp32-vs-bf16 150 "$build/bench/mixed_precision_bench" --device cuda --runs 3
run graphs-bench 300 bash "$src/bench/gpu_graph_bench.sh" "$build"

echo
echo "gpu-check summary ($(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)):"
printf '  %s\n' "${summary[@]}"
exit $failed
