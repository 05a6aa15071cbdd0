#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs into one file, for a GPU machine that has the NVIDIA
# driver and CUDA but none of copse's Debian packages (a lent machine with no network): the GPU
# suites and benches as built here (scripts/dev.sh build, with CUDA found), the shared libraries
# they need beyond glibc, libstdc++ and CUDA's own, the Fashion-MNIST files and the fortunes text.
# Paths are kept absolute, so the compiled-in source and build directories and the datasets'
# default directories hold there too.
#
#   scripts/gpu-bundle.sh                 # writes .gpu/bundle.tar.xz (ignored by git)
#   # there, in a copy of this checkout:
#   scripts/gpu-check.sh --bundle .gpu/bundle.tar.xz
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${COPSE_BUILD_DIR:-${src}-build}"
out="$src/.gpu/bundle.tar.xz"

bash "$src/scripts/dev.sh" build >/dev/null
[[ -x "$build/tests/ml/cuda/ml_cuda_tests" ]] ||
  { echo "gpu-bundle: $build was configured without CUDA (no ml_cuda_tests); nothing GPU to pack" >&2; exit 1; }

binaries=(
  cli/copse
  cli/copse-node
  tests/ml/cuda/ml_cuda_tests
  tests/ml_graph_cuda/ml_graph_cuda_tests
  tests/channels/nccl/channels_nccl_tests
  bench/ml_train_bench
  bench/mixed_precision_bench
)
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
libs="$build/.gpu-libs"
rm -rf "$libs" && mkdir -p "$libs"
paths=()
for b in "${binaries[@]}"; do
  [[ -x "$build/$b" ]] || { echo "gpu-bundle: $build/$b was not built" >&2; exit 1; }
  paths+=("$build/$b")
  # Everything the dynamic linker resolves outside glibc, libstdc++/libgcc and CUDA's toolkit:
  # the machine there has newer copies of those (and its driver's CUDA libraries).
  ldd "$build/$b" | awk '$3 ~ /^\// {print $3}' |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libmvec|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/usr/local/cuda' |
    while read -r lib; do cp -L -n "$lib" "$libs/"; done
done
paths+=("$libs" /usr/share/datasets/fashion-mnist /usr/share/games/fortunes)
echo "$src" >"$build/.gpu-source"
paths+=("$build/.gpu-source")
mkdir -p "$(dirname "$out")"
tar -cJf "$out" --absolute-names "${paths[@]}"
echo "gpu-bundle: $out ($(du -h "$out" | cut -f1)): ${#binaries[@]} programs, $(ls "$libs" | wc -l) libraries, the datasets"
