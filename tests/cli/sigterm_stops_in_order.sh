#!/bin/sh
# SIGTERM stops a job manager and a daemon in order, whichever of their threads the kernel
# hands it to: each exits 0 (not killed by the signal, 143), and the job manager writes the
# history of a job that finished just before it (its summary and events), which an abrupt end
# lost. Every process started here is stopped by its pid on the way out.
# Usage: sigterm_stops_in_order.sh COPSE_BINARY WORK_DIR
. "$(dirname "$0")/local_cluster.sh"
start_jm
start_daemon d0 2
daemon=$daemons
for round in 1 2 3; do
  "$copse" submit --state-dir "$d/jm" --wait "$(dirname "$0")/../../examples/diamond.json" > /dev/null 2>&1 ||
    { echo "round $round: the job failed"; exit 1; }
  kill -TERM "$jm"
  wait "$jm"
  echo "round $round: jm exit=$?"
  [ -f "$d/jm/history/$round/summary.json" ] && [ -f "$d/jm/history/$round/events.jsonl" ] &&
    echo "round $round: history written"
  start_jm
done
kill -TERM $daemon
wait $daemon
echo "daemon exit=$?"
daemons=
