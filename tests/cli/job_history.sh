#!/bin/sh
# Vertex logs and job history, as a user meets them: what an exec vertex prints is shown by
# `copse logs JOB VERTEX` (followed with -f, as JSON lines with -o json); a deterministic
# failure is not retried and points at its log (only when it printed something, and after
# a restart too); after a job manager restart the finished and
# resumed jobs' traces, event logs and vertex logs are all there, and once the job manager has
# forgotten a job (--finished-job-ttl-s) they are answered from its history, listed by `copse
# jobs`. `status -w -o json` prints one JSON object per line. Every process started here is
# stopped by its pid on the way out.
# Usage: job_history.sh COPSE_BINARY WORK_DIR
. "$(dirname "$0")/local_cluster.sh"
c() { "$copse" "$@" --state-dir "$d/jm"; }
start_jm
start_daemon d0 2

cat > "$d/prints.json" <<'JOB'
{"name": "prints", "stages": [{"name": "p", "program": "exec", "replicas": 2,
  "params": {"argv": ["sh", "-c", "echo hello-from-$COPSE_VERTEX >&2; echo on-stdout"], "stdout": false}}]}
JOB
cat > "$d/fails.json" <<'JOB'
{"name": "fails", "stages": [{"name": "x", "program": "exec", "max_attempts": 3,
  "params": {"argv": ["sh", "-c", "echo no such input >&2; exit 66"], "no_retry_exit_codes": [66]}}]}
JOB
cat > "$d/silent.json" <<'JOB'
{"name": "silent", "stages": [{"name": "s", "program": "exec", "max_attempts": 3,
  "params": {"argv": ["sh", "-c", "exit 66"], "no_retry_exit_codes": [66]}}]}
JOB
cat > "$d/resumed.json" <<'JOB'
{"name": "resumed", "stages": [{"name": "a", "program": "exec", "params": {"argv": ["sh", "-c", "echo a-ran >&2"]}},
  {"name": "b", "program": "exec", "params": {"argv": ["sh", "-c", "echo b-started >&2; sleep 6; echo b-ended >&2"]}}],
 "edges": [{"from": "a", "to": "b"}]}
JOB

c submit --wait "$d/prints.json" > /dev/null; echo "prints: submit --wait exit=$?"
c jobs -o json | grep -c '"name": "prints"' | sed 's/^/jobs lists a held job: /'
c logs 1 'p[1]' 2>&1
c logs 1 'p[0]' -o json | grep -c '"stream":"stderr","text":"hello-from-p\[0\]' | sed 's/^/json stderr records: /'
c status 2 -w -o json > /dev/null 2>&1 || true
c submit "$d/fails.json" > /dev/null
c status 2 -w -o json > "$d/watch.jsonl"; echo "fails: status -w exit=$?"
echo "watch lines: $(wc -l < "$d/watch.jsonl"), last state: $(tail -1 "$d/watch.jsonl" | grep -o '"state":"[a-z]*"')"
c status 2 | grep -E "not retried|what it printed"
c logs 2 'x[0]' 2>/dev/null
c submit --wait "$d/silent.json" > /dev/null 2>&1
c status 3 | grep -c "what it printed" | sed 's/^/hints for a failure that printed nothing: /'

# A job resumed across a restart: a ran before it, b after. b runs 6 s, longer than the restart
# takes on a loaded machine: the job manager must come back while b still runs.
c submit "$d/resumed.json" > /dev/null
i=0; until c logs 4 'b[0]' 2>/dev/null | grep -q b-started || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
c logs 4 'b[0]' -f > "$d/follow.txt" 2>&1 & follower=$!
i=0; until grep -qs b-started "$d/follow.txt" || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
kill "$jm"; wait "$jm" 2>/dev/null
start_jm
wait "$follower"; echo "logs -f across the restart exit=$?"; grep -E "reconnected|b-started|b-ended|attempt 1 ended" "$d/follow.txt"
c status 4 -w > /dev/null; echo "resumed: status -w exit=$?"
c trace 4 -f "$d/trace3.json" && grep -o '"name":"a\[0\]"' "$d/trace3.json" | head -1 | sed 's/^/resumed trace has /'
c trace 1 -f "$d/trace1.json" && echo "finished trace spans: $(grep -o '"name":"p\[[01]\]"' "$d/trace1.json" | sort -u | tr '\n' ' ')"
c logs 1 'p[0]' 2>/dev/null | sed 's/^/after restart: /'
c logs 1 | grep -c "completed on d0" | sed 's/^/event lines of completions: /'
# Restored failed jobs point at what their failed attempt printed, and only when it printed.
echo "hints after restart: $(c status 2 | grep -c "what it printed") and $(c status 3 | grep -c "what it printed")"

# Forgotten by the job manager: answered from the history.
kill "$jm"; wait "$jm" 2>/dev/null
start_jm --finished-job-ttl-s 0
sleep 1.5
c status 1 | grep -E "^job 1|from its history"
c logs 1 'p[1]' 2>/dev/null | sed 's/^/forgotten: /'
c trace 1 -f "$d/trace1b.json" && echo "forgotten trace spans: $(grep -o '"name":"p\[[01]\]"' "$d/trace1b.json" | sort -u | tr '\n' ' ')"
c status 1 --output "$d/out" 2>&1 | tail -1
c jobs
c jobs -o json | grep -c '"forgotten": true' | sed 's/^/forgotten in jobs -o json: /'
c jobs --since 1h | wc -l | sed 's/^/jobs --since 1h lines: /'
