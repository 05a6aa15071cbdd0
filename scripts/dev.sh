#!/usr/bin/env bash
# copse developer entry point: installs what is missing, builds out of the source tree, and
# runs the main example or the whole test suite.
#
#   scripts/dev.sh example   # install, build, run the main example on the embedded local cluster
#   scripts/dev.sh test      # install, build, run every test (CTest summary at the end)
#   scripts/dev.sh build     # install and build only
#
# Environment: COPSE_BUILD_DIR (default: <checkout>-build next to the checkout),
# COPSE_BUILD_TYPE (default Release), COPSE_CMAKE_ARGS (extra configure flags), COPSE_JOBS.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${COPSE_BUILD_DIR:-${src}-build}"
jobs="${COPSE_JOBS:-$(nproc)}"

# Debian packages copse needs to build and test; see docs/dependencies.md for why each.
packages=(
  build-essential cmake ninja-build pkg-config git rsync
  libasio-dev nlohmann-json3-dev libspdlog-dev libzmq3-dev cppzmq-dev doctest-dev
  libopenblas-dev libdnnl-dev libcli11-dev libxxhash-dev zlib1g-dev libssl-dev libgoogle-perftools-dev
  libprotobuf-dev protobuf-compiler libcpp-httplib-dev
  dataset-fashion-mnist fortunes python3 python3-jsonschema graphviz clang-format
)
# Only the test suite needs these: the dashboard's browser test, the metrics parser, the
# systemd and Slurm deployment tests, which start their own munge and Slurm daemons (on a host
# that runs systemd, installing slurm-wlm and munge also enables Debian's default services),
# the multi-host tests' packet filters (iptables in network namespaces) and the libFuzzer
# harnesses (clang).
test_packages=(
  chromium chromium-driver python3-selenium python3-prometheus-client
  systemd slurm-wlm munge iptables clang
)

install_missing() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "copse: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

configure_and_build() {
  if [ ! -f "$build/build.ninja" ]; then
    # shellcheck disable=SC2086
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${COPSE_BUILD_TYPE:-Release}" ${COPSE_CMAKE_ARGS:-}
  fi
  cmake --build "$build" -j "$jobs"
}

cmd="${1:-build}"
case "$cmd" in
  build)
    install_missing "${packages[@]}"
    configure_and_build
    ;;
  example)
    install_missing "${packages[@]}"
    configure_and_build
    out="${COPSE_OUTPUT_DIR:-$build/example-output}"
    # The main example: pipeline-parallel training of an MLP on Fashion-MNIST (2 stages x 8
    # micro-batches, 1F1B) with live progress, then test accuracy and the pipeline bubble.
    "$build/cli/copse" run "$src/examples/ml/mlp-pipeline2-1f1b-m8.json" --daemons 2 --output "$out"
    echo "copse: outputs in $out"
    ;;
  test)
    install_missing "${packages[@]}" "${test_packages[@]}"
    configure_and_build
    cd "$build"
    ctest --output-on-failure -j "$jobs" --timeout 900
    ;;
  *)
    echo "usage: scripts/dev.sh build|example|test" >&2
    exit 2
    ;;
esac
