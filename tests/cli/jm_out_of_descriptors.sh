#!/bin/bash
# A job manager out of file descriptors rests between failed accepts instead of spinning on
# the connection it cannot take, and serves again once descriptors are free. It runs with 64
# descriptors; 100 connections are held open against it for 1.5 s, during which it must use
# well under the whole core a spinning accept loop takes (measured: ~45-100 %), and say why.
# Every process started here is stopped by its pid on the way out.
# Usage: jm_out_of_descriptors.sh COPSE_BINARY WORK_DIR
copse=$1
d=$2
rm -rf "$d" && mkdir -p "$d" || exit 1
jm=
cleanup() { [ -n "$jm" ] && kill "$jm" 2>/dev/null; wait; }
trap cleanup EXIT
(ulimit -n 64 && exec "$copse" jm --listen 127.0.0.1:0 --state-dir "$d/jm" > "$d/jm.log" 2>&1) & jm=$!
i=0; while [ ! -f "$d/jm/jm.addr" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
[ -f "$d/jm/jm.addr" ] || { echo "the job manager did not start"; exit 1; }
port=$(sed 's/.*://' "$d/jm/jm.addr")
ticks() { awk '{print $14 + $15}' "/proc/$jm/stat"; }
for fd in $(seq 10 109); do eval "exec $fd<>/dev/tcp/127.0.0.1/$port" || exit 1; done
sleep 0.3
before=$(ticks)
sleep 1.5
after=$(ticks)
for fd in $(seq 10 109); do eval "exec $fd>&-"; done
hz=$(getconf CLK_TCK)
echo "job manager CPU while out of descriptors: $(( (after - before) * 1000 / hz )) ms in 1500 ms"
grep -q "cannot accept a connection (Too many open files); resting 100 ms" "$d/jm.log" || { echo "no warning in the log"; cat "$d/jm.log"; exit 1; }
[ $(( (after - before) * 1000 / hz )) -lt 300 ] || { echo "the accept loop spins"; exit 1; }
# Descriptors free again: it serves a client.
sleep 0.2
"$copse" status --state-dir "$d/jm" > /dev/null || { echo "no service after the descriptors came back"; exit 1; }
echo "ok"
