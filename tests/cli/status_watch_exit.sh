#!/bin/sh
# `copse status JOB -w` exits as `copse submit --wait` does (and kubectl wait): 0 only when the
# job completed, 1 when it failed. The servers say where they are once started. Every process
# started here is stopped by its pid on the way out.
# Usage: status_watch_exit.sh COPSE_BINARY WORK_DIR
. "$(dirname "$0")/local_cluster.sh"
start_jm
start_daemon d0 1 --log-level warn
echo '{"stages": [{"name": "x", "program": "exec", "max_attempts": 1, "params": {"argv": ["false"]}}]}' > "$d/fails.json"
echo '{"stages": [{"name": "x", "program": "noop"}]}' > "$d/works.json"
"$copse" submit --state-dir "$d/jm" "$d/fails.json" > /dev/null
"$copse" status --state-dir "$d/jm" 1 -w > /dev/null 2>&1; echo "failed job: status -w exit=$?"
"$copse" submit --state-dir "$d/jm" "$d/works.json" -o json
"$copse" status --state-dir "$d/jm" 2 -w > /dev/null 2>&1; echo "completed job: status -w exit=$?"
"$copse" status --state-dir "$d/jm" 1 > /dev/null 2>&1; echo "failed job: status exit=$?"
# The secret named by --token-file alone, with no state directory to fall back on.
HOME=/nonexistent COPSE_STATE_DIR= "$copse" daemons --jm "$(head -1 "$d/jm/jm.addr")" --token-file "$d/jm/secret" > /dev/null
echo "daemons --token-file exit=$?"
cat "$d/jm.out" "$d/d0.out"
