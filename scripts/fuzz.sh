#!/usr/bin/env bash
# Fuzzes copse's parsers and decoders with libFuzzer (docs/fuzzing.md says what each harness
# covers and checks).
#
#   scripts/fuzz.sh [--time SECONDS | --runs N] [--jobs N] [--build-dir DIR]
#                   [--build-only | --no-build] [HARNESS...] [-- LIBFUZZER_FLAG...]
#
# Configures and builds a fuzzing build with clang in DIR (default: <checkout>-fuzz-build next
# to the checkout), then fuzzes each HARNESS (default: all of job_file wire journal tensor
# output_store client_request) for SECONDS (default 60) or N executions, --jobs of them at a
# time (default 1), starting from its seed corpus fuzz/corpus/<name>/ and what earlier runs found
# (DIR/corpus/<name>/), with its dictionary fuzz/<name>.dict where there is one. Prints a line
# per harness: executions, rate, coverage, corpus. An input that crashes a harness, trips a
# sanitizer, runs over 30 s or uses over 2.5 GB is kept in DIR/crashes/ and the script exits 1
# naming it; replay it with DIR/fuzz/<name>_fuzzer FILE. Exits 77 (skipped) when clang or
# libFuzzer is not installed (scripts/dev.sh test installs them). COPSE_JOBS: compile jobs.
# Flags after -- go to libFuzzer as they are: e.g. -entropic=0, which doubles the executions a
# second here (libFuzzer's default power schedule spends half the time weighing its corpus).
set -uo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${src}-fuzz-build"
all=(job_file wire journal tensor output_store client_request)
limit=(-max_total_time=60)
jobs=1
mode=both
harnesses=()
extra=()
while (($#)); do
  case "$1" in
    --) shift; extra=("$@"); break ;;
    --time) limit=(-max_total_time="$2"); shift 2 ;;
    --runs) limit=(-runs="$2"); shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    --build-only) mode=build; shift ;;
    --no-build) mode=run; shift ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *)
      [[ " ${all[*]} " == *" $1 "* ]] || { echo "fuzz.sh: no harness named $1 (there are: ${all[*]})" >&2; exit 2; }
      harnesses+=("$1"); shift ;;
  esac
done
((${#harnesses[@]})) || harnesses=("${all[@]}")

if [ "$mode" != run ]; then
  if ! command -v clang++ > /dev/null; then
    echo "skipped: clang++ is not installed (scripts/dev.sh test installs clang)"
    exit 77
  fi
  if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    clang++ -x c++ -fsanitize=fuzzer -o /dev/null - 2> /dev/null; then
    echo "skipped: clang++ cannot link libFuzzer (-fsanitize=fuzzer)"
    exit 77
  fi
  if [ ! -f "$build/build.ninja" ]; then
    # -O1 with line tables: what libFuzzer's documentation suggests, and quick to compile.
    CC=clang CXX=clang++ cmake -S "$src" -B "$build" -G Ninja -DCOPSE_FUZZ=ON -DCOPSE_CUDA=OFF -DCOPSE_ONEDNN=OFF \
      -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_CXX_FLAGS_FUZZ="-O1 -gline-tables-only" \
      -DCMAKE_C_FLAGS_FUZZ="-O1 -gline-tables-only" > "$build.configure.log" 2>&1 ||
      { cat "$build.configure.log"; echo "fuzz.sh: configuring $build failed"; exit 1; }
  fi
  cmake --build "$build" --target fuzzers -j "${COPSE_JOBS:-$(nproc)}" || { echo "fuzz.sh: building the harnesses failed"; exit 1; }
  [ "$mode" = build ] && exit 0
fi
for name in "${harnesses[@]}"; do
  if [ ! -x "$build/fuzz/${name}_fuzzer" ]; then
    echo "skipped: $build/fuzz/${name}_fuzzer was not built (no clang, or run without --no-build first)"
    exit 77
  fi
done

# One harness: fuzz, then one summary line from libFuzzer's final statistics.
fuzz_one() {
  local name=$1 log="$build/logs/$1.log" corpus="$build/corpus/$1"
  mkdir -p "$corpus" "$build/crashes" "$build/logs"
  # -error_exitcode: libFuzzer's own default, 77, is what CTest takes for "skipped".
  local args=("${limit[@]}" -timeout=30 -rss_limit_mb=2560 -max_len=16384 -print_final_stats=1 -error_exitcode=1
    -artifact_prefix="$build/crashes/$name-" "${extra[@]}")
  [ -f "$src/fuzz/$name.dict" ] && args+=(-dict="$src/fuzz/$name.dict")
  local started=$SECONDS
  "$build/fuzz/${name}_fuzzer" "${args[@]}" "$corpus" "$src/fuzz/corpus/$name" > "$log" 2>&1
  local rc=$? seconds=$((SECONDS - started))
  local runs cov corp
  runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corp=$(find "$corpus" -type f | wc -l)
  if [ $rc -ne 0 ]; then
    local artifact
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    echo "fuzz $name: FAILED after ${seconds} s (exit $rc); input: ${artifact:-none written}; log: $log"
    grep -m 12 -E 'ERROR|property violated|SUMMARY|runtime error|#[0-9]+ 0x' "$log" | sed 's/^/  /'
    return 1
  fi
  echo "fuzz $name: ${runs:-?} runs in ${seconds} s ($(( ${runs:-0} / (seconds > 0 ? seconds : 1) ))/s), coverage ${cov:-?} edges, corpus $corp inputs, no crash"
}

failed=0
running=0
for name in "${harnesses[@]}"; do
  fuzz_one "$name" &
  running=$((running + 1))
  if ((running >= jobs)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
done
while ((running > 0)); do
  wait -n || failed=1
  running=$((running - 1))
done
exit $failed
