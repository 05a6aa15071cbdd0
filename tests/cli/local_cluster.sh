# Sourced by the CLI tests that run a job manager and daemons on 127.0.0.1, as
#   . "$(dirname "$0")/local_cluster.sh"      (the script's arguments: COPSE_BINARY WORK_DIR)
# Sets $copse and $d, empties $d, and stops every process it started, by its pid, when the
# script exits.
copse=$1
d=$2
export COPSE_DIE_WITH_PARENT=1
rm -rf "$d" && mkdir -p "$d" || exit 1
jm= daemons=
cleanup() { for p in $daemons $jm; do kill "$p" 2>/dev/null; done; wait; }
trap cleanup EXIT

# start_jm [FLAG…]: a job manager on state directory $d/jm (its output appended to $d/jm.out),
# waited for until it has published its address (at most 20 s).
start_jm() {
  rm -f "$d/jm/jm.addr"
  "$copse" jm --listen 127.0.0.1:0 --state-dir "$d/jm" "$@" >> "$d/jm.out" 2>&1 &
  jm=$!
  i=0; while [ ! -f "$d/jm/jm.addr" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
}

# start_daemon NAME CPUS [FLAG…]: a daemon of that job manager, work dir $d/w-NAME, output in $d/NAME.out.
start_daemon() {
  name=$1 cpus=$2
  shift 2
  "$copse" daemon --state-dir "$d/jm" --name "$name" --cpus "$cpus" --work-dir "$d/w-$name" "$@" > "$d/$name.out" 2>&1 &
  daemons="$daemons $!"
}
