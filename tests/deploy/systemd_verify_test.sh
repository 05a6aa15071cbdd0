#!/bin/bash
# deploy/systemd's units: `systemd-analyze verify` finds no error or warning in them (with
# ExecStart pointing at the built binary, since verify checks that it exists), and their command
# lines, expanded as systemd would (specifiers, Environment=, the example env files,
# ${VAR} as one word and $VAR split on spaces), run a job manager and a daemon that complete a
# job. Both processes are stopped by their pid at the end.
#
#   systemd_verify_test.sh COPSE_BINARY
#
# Exit 77 ("skipped: why") without systemd-analyze (Debian: the systemd package).
set -u
copse=${1:?usage: systemd_verify_test.sh COPSE_BINARY}
src=$(cd "$(dirname "$0")/../.." && pwd)
units=$src/deploy/systemd
command -v systemd-analyze > /dev/null 2>&1 || { echo "skipped: systemd-analyze is not installed (Debian: apt-get install systemd)"; exit 77; }
[ -x "$copse" ] || { echo "FAIL: no copse binary at $copse"; exit 1; }
unset COPSE_JM COPSE_STATE_DIR COPSE_TOKEN_FILE COPSE_JM_ARGS COPSE_DAEMON_ARGS
export COPSE_DIE_WITH_PARENT=1

t=$(mktemp -d /tmp/copse-systemd-test.XXXXXX) || exit 1
pids=""
cleanup() {
  for p in $pids; do
    kill -TERM "$p" 2> /dev/null || continue
    for _ in $(seq 100); do kill -0 "$p" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2> /dev/null
    wait "$p" 2> /dev/null
  done
  rm -rf "$t"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

# 1. systemd-analyze verify, the units installed in a directory of their own.
mkdir "$t/units"
for u in copse-jm.service copse-daemon@.service; do
  sed "s|^ExecStart=/usr/bin/copse |ExecStart=$copse |" "$units/$u" > "$t/units/$u"
  grep -q "^ExecStart=$copse " "$t/units/$u" || fail "$u: no ExecStart=/usr/bin/copse line"
done
out=$(cd "$t/units" && systemd-analyze verify --man=no "$t/units/copse-jm.service" "$t/units/copse-daemon@test.service" 2>&1)
rc=$?
echo "systemd-analyze verify: exit $rc${out:+, said:}"
[ -n "$out" ] && echo "$out"
[ $rc -eq 0 ] || fail "systemd-analyze verify failed"
echo "$out" | grep -q "copse" && fail "systemd-analyze verify warned about the units"
echo "systemd-analyze verify: no error or warning"

# 2. The command lines systemd would run.
# env_lines FILE PREFIX: the KEY=VALUE assignments of FILE's lines that start with PREFIX
# (Environment= lines of a unit, or every line of an env file with an empty PREFIX).
env_lines() {
  sed -n "s/^$2\([A-Za-z_][A-Za-z0-9_]*=.*\)$/\1/p" "$1"
}
# set_env ASSIGNMENT…: as systemd assigns them: the value up to the end of the line, quotes
# around all of it removed.
set_env() {
  local a k v
  for a in "$@"; do
    k=${a%%=*} v=${a#*=}
    case $v in \"*\") v=${v#\"} v=${v%\"} ;; esac
    export "$k=$v"
  done
}
# exec_argv UNIT INSTANCE STATE_ROOT: the unit's ExecStart with specifiers expanded, one word
# per line after the variables are expanded (call within the unit's environment).
exec_argv() {
  local line
  line=$(sed -n 's/^ExecStart=//p' "$units/$1")
  line=${line//%i/$2}
  line=${line//%S/$3}
  line=${line//%H/$(hostname)}
  line=${line//%%/%}
  # ${VAR}: one word; $VAR: split on whitespace (systemd.service(5), "Command lines").
  line=$(sed 's/\${\([A-Za-z_][A-Za-z0-9_]*\)}/"${\1}"/g' <<< "$line")
  set +u  # an unset variable expands to nothing, as in systemd
  eval "set -- $line"
  printf '%s\n' "$@"
}
# unit_env UNIT ENV_FILE: the unit's Environment= lines, then the example env file's.
unit_env() {
  local IFS=$'\n'
  # shellcheck disable=SC2046
  set_env $(env_lines "$units/$1" 'Environment=') $(env_lines "$units/$2" '')
}

# The daemons' default state directory is the job manager's.
jm_state=$( (unit_env copse-jm.service jm.env && exec_argv copse-jm.service "" /var/lib) | sed -n '/^--state-dir$/{n;p}')
daemon_state=$( (unit_env copse-daemon@.service daemon.env && echo "$COPSE_STATE_DIR"))
[ "$jm_state" = /var/lib/copse/jm ] && [ "$daemon_state" = "$jm_state" ] ||
  fail "the job manager's state directory ($jm_state) is not the daemons' default ($daemon_state)"
echo "state directory: $jm_state in both units"

root=$t/state
mkdir -p "$root/copse"
(
  unit_env copse-jm.service jm.env
  export COPSE_LISTEN=127.0.0.1:0 COPSE_JM_ARGS="--heartbeat-timeout-ms 5000 --placement load"
  mapfile -t argv < <(exec_argv copse-jm.service "" "$root")
  echo "jm: ${argv[*]:1}" > "$t/jm.cmd"
  exec "$copse" "${argv[@]:1}"
) > "$t/jm.out" 2>&1 &
pids="$! $pids"
for _ in $(seq 200); do [ -s "$root/copse/jm/jm.addr" ] && break; sleep 0.05; done
cat "$t/jm.cmd"
[ -s "$root/copse/jm/jm.addr" ] || fail "the job manager did not start: $(cat "$t/jm.out")"

(
  unit_env copse-daemon@.service daemon.env
  export COPSE_STATE_DIR=$root/copse/jm COPSE_DAEMON_ARGS="--cpus 2 --label rack=r1"
  mapfile -t argv < <(exec_argv copse-daemon@.service test-daemon "$root")
  echo "daemon: ${argv[*]:1}" > "$t/daemon.cmd"
  exec "$copse" "${argv[@]:1}"
) > "$t/daemon.out" 2>&1 &
pids="$! $pids"
for _ in $(seq 200); do grep -q "registered" "$t/daemon.out" && break; sleep 0.05; done
cat "$t/daemon.cmd"
grep -q "registered" "$t/daemon.out" || fail "the daemon did not register: $(cat "$t/daemon.out")"

export COPSE_STATE_DIR=$root/copse/jm
daemons=$("$copse" daemons)
echo "$daemons"
echo "$daemons" | grep -q "^test-daemon .*alive .*host=$(hostname)" || fail "no daemon test-daemon with label host=$(hostname)"
echo "$daemons" | grep -q "rack=r1" || fail "\$COPSE_DAEMON_ARGS was not split into flags"
timeout 60 "$copse" submit --wait --output "$t/out" "$src/examples/diamond.json" || fail "the job did not complete"
[ -s "$t/out/digest.txt" ] || fail "no output"
[ -d "$root/copse/daemon-test-daemon/outputs" ] || fail "the daemon's work dir is not %S/copse/daemon-%i"
echo "PASS: the units verify, and their command lines run a job to completion"
