#!/bin/sh
# `copse submit --wait` and `copse status -w` outlive job manager restarts: the job manager is
# killed twice while they wait and started again on its state directory (on a new port each
# time); both reconnect through jm.addr, and the job they follow completes. `copse status JOB
# --output` then copies the finished job's outputs again. Every process started here is stopped
# by its pid on the way out (and dies with this shell should it be killed: COPSE_DIE_WITH_PARENT).
# Usage: watch_survives_jm_restart.sh COPSE_BINARY WORK_DIR
copse=$1
d=$2
export COPSE_DIE_WITH_PARENT=1
rm -rf "$d" && mkdir -p "$d" || exit 1
jm= daemon= submit= watch=
cleanup() { for p in $watch $submit $daemon $jm; do kill "$p" 2>/dev/null; done; wait; }
trap cleanup EXIT
wait_for_file() { i=0; while [ ! -f "$1" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done; [ -f "$1" ]; }
start_jm() {
  rm -f "$d/jm/jm.addr"
  "$copse" jm --listen 127.0.0.1:0 --state-dir "$d/jm" >> "$d/jm.log" 2>&1 & jm=$!
  wait_for_file "$d/jm/jm.addr" || { echo "the job manager did not start"; exit 1; }
}
restart_jm() { kill -9 $jm; wait $jm 2>/dev/null; start_jm; }

start_jm
"$copse" daemon --state-dir "$d/jm" --name d0 --cpus 1 --work-dir "$d/w0" > "$d/daemon.log" 2>&1 & daemon=$!
cat > "$d/job.json" <<'JOB'
{"stages": [{"name": "slow", "program": "checksum", "params": {"sleep_ms": 8000}},
            {"name": "last", "program": "checksum"}],
 "edges": [{"from": "slow", "to": "last"}],
 "outputs": [{"from": "last", "path": "digest.txt"}]}
JOB
"$copse" submit --state-dir "$d/jm" --wait --output "$d/out" "$d/job.json" > "$d/submit.out" 2> "$d/submit.err" & submit=$!
# The watcher starts once the job exists (a fresh state directory: job 1), and is given time
# to connect before the first kill.
i=0; until "$copse" status --state-dir "$d/jm" 1 > /dev/null 2>&1 || [ $i -ge 200 ]; do sleep 0.05; i=$((i + 1)); done
"$copse" status --state-dir "$d/jm" 1 -w > "$d/watch.out" 2> "$d/watch.err" & watch=$!
sleep 1.5
restart_jm
sleep 1.5
restart_jm
wait $submit; submit_rc=$?; submit=
wait $watch; watch_rc=$?; watch=
echo "submit exit=$submit_rc"; cat "$d/submit.err" "$d/submit.out"
echo "status -w exit=$watch_rc"; cat "$d/watch.err" "$d/watch.out"
"$copse" status --state-dir "$d/jm" 1 --output "$d/again" > /dev/null; copy_rc=$?
echo "status --output exit=$copy_rc"
[ $submit_rc -eq 0 ] && [ $watch_rc -eq 0 ] && [ -s "$d/out/digest.txt" ] &&
  [ "$(grep -c reconnected "$d/submit.err")" -eq 2 ] && [ "$(grep -c reconnected "$d/watch.err")" -eq 2 ] &&
  [ $copy_rc -eq 0 ] && cmp "$d/out/digest.txt" "$d/again/digest.txt"
