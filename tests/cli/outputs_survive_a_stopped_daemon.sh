#!/bin/sh
# The hostile test's data loss, reproduced on loopback: a completed job's declared outputs must
# stay fetchable when the daemon holding them is stopped (kill -STOP) for longer than its
# return grace, declared lost, then continued and registered again under its name. Before the
# fix the job manager released every output the returning daemon listed and `copse status
# --output` failed with "not stored here". Every process started here is stopped by its pid on
# the way out. Usage: outputs_survive_a_stopped_daemon.sh COPSE_BINARY EXAMPLES_DIR WORK_DIR
copse=$1
examples=$2
d=$3
export COPSE_DIE_WITH_PARENT=1
rm -rf "$d" && mkdir -p "$d" || exit 1
jm= daemon=
cleanup() {
  [ -n "$daemon" ] && kill -CONT "$daemon" 2>/dev/null
  for p in $daemon $jm; do kill "$p" 2>/dev/null; done
  wait
}
trap cleanup EXIT
wait_for_file() { i=0; while [ ! -f "$1" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done; [ -f "$1" ]; }
"$copse" jm --listen 127.0.0.1:0 --state-dir "$d/jm" --heartbeat-timeout-ms 500 > "$d/jm.log" 2>&1 & jm=$!
wait_for_file "$d/jm/jm.addr" || { echo "the job manager did not start"; exit 1; }
"$copse" daemon --state-dir "$d/jm" --name d0 --cpus 2 --work-dir "$d/w0" > "$d/daemon.log" 2>&1 & daemon=$!
"$copse" submit --state-dir "$d/jm" --wait --output "$d/o1" "$examples/diamond.json" > "$d/submit.out" 2>&1 ||
  { echo "the job failed"; cat "$d/submit.out"; exit 1; }
kill -STOP "$daemon"
# Past the heartbeat timeout and the return grace (1 s): the daemon is given up.
i=0; until "$copse" daemons --state-dir "$d/jm" 2>/dev/null | grep -q lost || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
"$copse" daemons --state-dir "$d/jm"
kill -CONT "$daemon"
# Back under its name: a second registration, alive.
i=0; until [ "$("$copse" daemons --state-dir "$d/jm" --all 2>/dev/null | grep -c alive)" -ge 1 ] || [ $i -ge 100 ]; do
  sleep 0.1; i=$((i + 1))
done
"$copse" daemons --state-dir "$d/jm" --all
"$copse" status --state-dir "$d/jm" 1 --output "$d/o2"; rc=$?
echo "status --output exit=$rc"
[ $rc -eq 0 ] && diff -r "$d/o1" "$d/o2" && echo "outputs identical"
