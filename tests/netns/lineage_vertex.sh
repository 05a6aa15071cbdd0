#!/bin/sh
# A vertex of the tests/netns lineage jobs (netns_cluster.lineage_job), run by copse's `exec`.
# usage: lineage_vertex.sh PAD_BYTES SLEEP_MS [sink]
# Reads $COPSE_INPUT_0 ... and writes every output port k to $COPSE_OUTPUT_k:
#   D <digest>                                  sha256 of this vertex's name, k and its inputs'
#                                               D lines in port order: the same on every run
#   S <vertex> v<N>                             who wrote it: this vertex, its attempt
#   E <vertex> v<N> p<k> <- <producer> v<M>     each input read, here and upstream (the
#                                               attempt of the producer whose output it read)
#   P xxxx...                                   PAD_BYTES of padding, to move bytes
# A sink (third argument) writes its D line alone to port 0 and its S and E lines to port 1.
set -eu
pad=$1
sleep_ms=$2
role=${3:-}
me="$COPSE_VERTEX v$COPSE_VERSION"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: > "$work/d"
: > "$work/e"
k=0
while [ "$k" -lt "${COPSE_NUM_INPUTS:-0}" ]; do
  eval "in=\${COPSE_INPUT_$k}"
  if [ "$(grep -c '^D ' "$in")" != 1 ] || [ "$(grep -c '^S ' "$in")" != 1 ]; then
    echo "lineage_vertex: input $k of $me is not one producer's output:" >&2
    head -c 300 "$in" >&2
    exit 1
  fi
  grep '^D ' "$in" >> "$work/d"
  grep '^E ' "$in" >> "$work/e" || true
  echo "E $me p$k <- $(grep '^S ' "$in" | cut -d' ' -f2-)" >> "$work/e"
  k=$((k + 1))
done
if [ "$sleep_ms" -gt 0 ]; then
  sleep "$(printf '%d.%03d' $((sleep_ms / 1000)) $((sleep_ms % 1000)))"
fi
data=$( { echo "$COPSE_VERTEX"; cat "$work/d"; } | sha256sum | cut -c1-64)
sort -u "$work/e" -o "$work/e"
if [ "$pad" -gt 0 ]; then
  head -c "$pad" /dev/zero | tr '\0' x | fold -w 99 | sed 's/^/P /' > "$work/p"
else
  : > "$work/p"
fi
if [ "$role" = sink ]; then
  echo "D $data" > "$COPSE_OUTPUT_0"
  { echo "S $me"; cat "$work/e"; } > "$COPSE_OUTPUT_1"
  exit 0
fi
k=0
while [ "$k" -lt "${COPSE_NUM_OUTPUTS:-0}" ]; do
  eval "out=\${COPSE_OUTPUT_$k}"
  {
    echo "D $(echo "$data $k" | sha256sum | cut -c1-64)"
    echo "S $me"
    cat "$work/e" "$work/p"
  } > "$out"
  k=$((k + 1))
done
