#!/bin/sh
# A daemon partitioned from its job manager, on two hosts made of network namespaces (the job
# manager and daemon d1 on 10.213.0.1, daemon d0 on 10.213.0.2, joined by a veth pair; the
# partition is the job manager's end of the link set down: d0's packets to it vanish, its own
# interface stays up, as behind a failed switch).
# Checks, for a partition of twice the heartbeat timeout and more:
#   - d0 notices while the partition lasts and abandons the attempt it was running (which the
#     job manager re-ran elsewhere), instead of running it on for as long as the partition;
#   - once healed, d0 registers again and the job it held outputs of, completed before the
#     partition, still has them: `copse status --output` copies the same bytes.
# Exits 77 (skipped) where network namespaces cannot be made. Every process started here is
# stopped by its pid, and the namespaces deleted, on the way out.
# Usage: partitioned_daemon.sh COPSE_BINARY EXAMPLES_DIR WORK_DIR
copse=$1
examples=$2
d=$3
export COPSE_DIE_WITH_PARENT=1
ns_jm=copse-jm-$$
ns_d0=copse-d0-$$
jm= d0= d1=
cleanup() {
  for p in $d0 $d1 $jm; do kill "$p" 2>/dev/null; done
  wait
  ip netns del "$ns_jm" 2>/dev/null
  ip netns del "$ns_d0" 2>/dev/null
}
trap cleanup EXIT
rm -rf "$d" && mkdir -p "$d" || exit 1
if ! ip netns add "$ns_jm" 2>"$d/netns.err" || ! ip netns add "$ns_d0" 2>>"$d/netns.err"; then
  echo "skipped: cannot create network namespaces: $(cat "$d/netns.err")"
  exit 77
fi
in_jm() { ip netns exec "$ns_jm" "$@"; }
in_d0() { ip netns exec "$ns_d0" "$@"; }
ip link add "cj$$" netns "$ns_jm" type veth peer name "cd$$" netns "$ns_d0" || { echo "skipped: no veth"; exit 77; }
in_jm ip addr add 10.213.0.1/24 dev "cj$$" && in_jm ip link set "cj$$" up && in_jm ip link set lo up &&
  in_d0 ip addr add 10.213.0.2/24 dev "cd$$" && in_d0 ip link set "cd$$" up && in_d0 ip link set lo up || exit 1

wait_for_file() { i=0; while [ ! -f "$1" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done; [ -f "$1" ]; }
in_jm "$copse" jm --listen 10.213.0.1:0 --state-dir "$d/jm" --heartbeat-timeout-ms 500 > "$d/jm.log" 2>&1 & jm=$!
wait_for_file "$d/jm/jm.addr" || { echo "the job manager did not start"; exit 1; }
addr=$(head -1 "$d/jm/jm.addr")
export COPSE_TOKEN_FILE="$d/jm/secret"
in_d0 "$copse" daemon --jm "$addr" --name d0 --cpus 2 --work-dir "$d/w0" --data-host 10.213.0.2 > "$d/d0.log" 2>&1 & d0=$!
i=0; until in_jm "$copse" daemons --jm "$addr" 2>/dev/null | grep -q "^d0 .*alive" || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
in_jm "$copse" submit --jm "$addr" --wait --output "$d/o1" "$examples/diamond.json" > "$d/submit.out" 2>&1 ||
  { echo "the job failed"; cat "$d/submit.out"; exit 1; }
# A long vertex on d0, then d1 beside the job manager to take it over.
cat > "$d/long.json" <<'JOB'
{"stages": [{"name": "long", "program": "checksum", "params": {"sleep_ms": 60000}}]}
JOB
in_jm "$copse" submit --jm "$addr" "$d/long.json" > /dev/null || exit 1
i=0; until grep -q "long\[0\] version 1 placed on d0" "$d/jm.log" 2>/dev/null || in_jm "$copse" logs --jm "$addr" 2 2>/dev/null | grep -q "placed on d0" || [ $i -ge 100 ]; do
  sleep 0.1; i=$((i + 1))
done
in_jm "$copse" daemon --jm "$addr" --name d1 --cpus 2 --work-dir "$d/w1" --data-host 10.213.0.1 > "$d/d1.log" 2>&1 & d1=$!

in_jm ip link set "cj$$" down
echo "partitioned d0"
sleep 4
# During the partition: d0 has given up its job manager connection and with it the attempt.
if grep -q "reconnecting" "$d/d0.log"; then echo "d0 noticed the partition"; else echo "d0 did not notice the partition"; fi
in_jm ip link set "cj$$" up
echo "healed"
i=0; until [ "$(in_jm "$copse" daemons --jm "$addr" --all 2>/dev/null | grep -c '^d0 .*alive')" -ge 1 ] || [ $i -ge 150 ]; do
  sleep 0.1; i=$((i + 1))
done
in_jm "$copse" daemons --jm "$addr" --all
in_jm "$copse" status --jm "$addr" 1 --output "$d/o2"; rc=$?
echo "status --output exit=$rc"
[ $rc -eq 0 ] && diff -r "$d/o1" "$d/o2" && echo "outputs identical"
