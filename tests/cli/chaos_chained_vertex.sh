#!/bin/sh
# `copse chaos fail JOB VERTEX`, armed while VERTEX waits on its daemon behind its running
# predecessor (chained dispatch), fires when it runs: the job completes after a retry, its
# faults list the fail and nothing is listed as never fired; what the chained vertex read from
# its predecessor on the same daemon counts as local input bytes. Every process started here is
# stopped by its pid on the way out.
# Usage: chaos_chained_vertex.sh COPSE_BINARY WORK_DIR
. "$(dirname "$0")/local_cluster.sh"
start_jm
start_daemon d0 2
cat > "$d/chain.json" <<'JOB'
{"name": "chain", "stages": [
  {"name": "a", "program": "exec", "affinity": "g", "params": {"argv": ["sh", "-c", "echo a-started >&2; sleep 1.5; echo data"]}},
  {"name": "b", "program": "exec", "affinity": "g", "params": {"argv": ["cat"], "stdin": true}}],
 "edges": [{"from": "a", "to": "b"}], "outputs": [{"from": "b", "path": "out.txt"}]}
JOB
"$copse" submit --state-dir "$d/jm" "$d/chain.json" > /dev/null
i=0; until "$copse" logs --state-dir "$d/jm" 1 'a[0]' 2>/dev/null | grep -q a-started || [ $i -ge 100 ]; do sleep 0.05; i=$((i + 1)); done
"$copse" chaos fail 1 'b[0]' --state-dir "$d/jm"
"$copse" status --state-dir "$d/jm" 1 -w -o json > "$d/watch.jsonl"; echo "status -w exit=$?"
tail -1 "$d/watch.jsonl" | grep -o '"faults":\[[^]]*\]'
tail -1 "$d/watch.jsonl" | grep -c faults_not_fired | sed 's/^/faults_not_fired: /'
"$copse" logs --state-dir "$d/jm" 1 'b[0]' --events | grep -o "withdrawn: copse chaos armed a fault on it before it started"
# b, chained on a's daemon, read a's output there: counted as local input bytes.
tail -1 "$d/watch.jsonl" | grep -o '"input_bytes":{"local":[0-9]*' | sed 's/.*:/read locally: /'
