#!/usr/bin/env bash
# Training graphs on one GPU (copse graph --device cuda): images/s and test accuracy of the MLP
# (784-1024-1024-10, batch 128, SGD lr 0.05 momentum 0.9) on the first 12,800 training images
# (100 steps), fp32, bf16 and fp16 (dynamic loss scaling), for
#   - PyTorch CUDA (scripts/torch_bench.py --device cuda, bf16 and fp16 = autocast, fp16 with
#     its GradScaler; median of 3 runs),
#   - copse's single process (copse train --device cuda),
#   - a data-parallel graph of 2 workers (tree reducer) and a 2-stage 1F1B pipeline of 4
#     micro-batches (in fp16 its stages skip overflowed steps together: per-micro-batch weight
#     gradients and a step check), every compute vertex on the GPU of a one-daemon local cluster
#     (copse run --daemons 1 --gpus 1), images/s from the job's own clock (init to eval).
# Without a GPU it says so and exits 0. A benchmark: it prints figures and never fails on them.
#
#   bench/gpu_graph_bench.sh [BUILD_DIR]
set -uo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-${COPSE_BUILD_DIR:-${src}-build}}"
copse="$build/cli/copse"
python="${COPSE_PYTHON:-python3}"
images=12800

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_graph_bench: no NVIDIA GPU here: nothing to measure"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# graph KIND PRECISION FLAGS...: images/s and accuracy of a generated graph run on the GPU.
graph() {
  local kind=$1 precision=$2
  shift 2
  local dir="$work/$kind-$precision-$RANDOM"
  mkdir -p "$dir"
  "$copse" graph "$kind" --model mlp --limit "$images" --epochs 1 --batch 128 --device cuda --precision "$precision" \
    "$@" -f "$dir/job.json" >/dev/null || { echo "failed (copse graph)"; return; }
  if ! timeout 300 "$copse" run "$dir/job.json" --daemons 1 --gpus 1 --cpus 8 --output "$dir/out" -o json \
    >"$dir/summary.json" 2>"$dir/stderr.txt"; then
    echo "failed: $("$python" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("failure", ""))' "$dir/summary.json" 2>/dev/null ||
      tail -n 2 "$dir/stderr.txt" | tr '\n' ' ')"
    return
  fi
  "$python" -c 'import json,sys; m=json.load(open(sys.argv[1])); print("%9.0f   %.2f %%" % (m["images_per_s"], 100*m["test_accuracy"]))' \
    "$dir/out/metrics.json"
}

single() {
  local out
  out=$("$copse" train --model mlp --limit "$images" --epochs 1 --batch 128 --device cuda --precision "$1" 2>&1 | tail -n 1)
  [[ "$out" == done:* ]] || { echo "failed: $out"; return; }
  echo "$out" | sed -n 's/.*test accuracy \([0-9.]*\) %.*, \([0-9]*\) images\/s.*/\2   \1 %/p' | awk '{printf "%9.0f   %s %%\n", $1, $2}'
}

torch() {
  local line
  line=$("$python" "$src/scripts/torch_bench.py" --model mlp --images "$images" --runs 3 --device cuda --precision "$1" 2>/dev/null)
  [[ -n "$line" ]] || { echo "        -   (PyTorch unavailable)"; return; }
  echo "$line" | "$python" -c 'import json,sys; d=json.loads(sys.stdin.read()); print("%9.0f   (torch %s)" % (d["median"], d.get("torch", "?")))'
}

echo "gpu_graph_bench ($(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)): MLP, $images images, batch 128"
printf '%-6s %-38s %9s   %s\n' precision run images/s "test accuracy"
for p in fp32 bf16 fp16; do
  printf '%-6s %-38s %s\n' "$p" "PyTorch CUDA" "$(torch "$p")"
  printf '%-6s %-38s %s\n' "$p" "copse single process" "$(single "$p")"
  printf '%-6s %-38s %s\n' "$p" "copse data-parallel 2 (tree)" "$(graph data-parallel "$p" --workers 2)"
  printf '%-6s %-38s %s\n' "$p" "copse pipeline 2 (1F1B, M=4)" "$(graph pipeline "$p" --stages 2 --microbatches 4)"
done
