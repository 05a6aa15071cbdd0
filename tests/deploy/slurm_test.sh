#!/bin/bash
# deploy/slurm/copse-slurm.sbatch on a real, private, one-node Slurm cluster started here: munged
# (its own key, socket and logs), slurmctld and slurmd on free loopback ports with a generated
# slurm.conf, everything under one temporary directory. The launcher runs a small job to
# completion (its output equal to `copse run`'s), and a failing job's exit status comes back
# through Slurm. Every process started (munged, slurmctld, slurmd, and what Slurm started for
# the jobs) is stopped by its pid at the end, and the test checks that none is left.
#
#   slurm_test.sh COPSE_BINARY
#
# Exit 77 ("skipped: why") without slurm-wlm and munge, when not root (slurmd runs jobs as
# their submitter), or when munged or Slurm cannot start here.
set -u
copse=${1:?usage: slurm_test.sh COPSE_BINARY}
src=$(cd "$(dirname "$0")/../.." && pwd)
launcher=$src/deploy/slurm/copse-slurm.sbatch
example=$src/examples/diamond.json
export PATH=$PATH:/usr/sbin:/sbin
# A test run inside a Slurm job must not talk to that cluster.
for v in $(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset COPSE_JM COPSE_STATE_DIR COPSE_TOKEN_FILE

skip() {
  echo "skipped: $*"
  exit 77
}
for b in munged mungekey munge unmunge slurmctld slurmd sbatch squeue scontrol scancel srun sinfo python3 timeout; do
  command -v "$b" > /dev/null 2>&1 || skip "$b is not installed (Debian: apt-get install slurm-wlm munge)"
done
[ "$(id -u)" -eq 0 ] || skip "not root (slurmd must run as root to run jobs)"
[ -x "$copse" ] || { echo "FAIL: no copse binary at $copse"; exit 1; }
deadline=$((SECONDS + 200))

# munged refuses a socket directory whose ancestors are not searchable by all, and a key readable
# by others: $t is 0755, its key directory 0700.
t=$(mktemp -d /tmp/copse-slurm-test.XXXXXX) || exit 1
chmod 755 "$t"
conf=$t/slurm.conf
marker="SLURM_CONF=$conf"
node=$(hostname -s)
pids=""
# Slurm's commands, with this cluster's configuration (not exported: the final sweep looks for
# the processes whose environment names it).
sl() { SLURM_CONF=$conf "$@"; }

# The processes our private cluster started (its daemons, slurmstepd, the jobs' processes): all
# of them, and only them, carry SLURM_CONF=$conf in their environment.
cluster_pids() {
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = $$ ] && continue
    grep -qsF "$marker" "/proc/$p/environ" 2> /dev/null && echo "$p"
  done
}

stop_pid() {
  kill -TERM "$1" 2> /dev/null || return 0
  for _ in $(seq 100); do kill -0 "$1" 2> /dev/null || break; sleep 0.1; done
  kill -KILL "$1" 2> /dev/null
  wait "$1" 2> /dev/null
}

cleanup() {
  trap - EXIT INT TERM
  # Jobs first (their steps end while slurmd still runs them), then the daemons, newest first.
  if [ -n "${jobs_submitted:-}" ]; then
    # shellcheck disable=SC2086  # one argument per job id
    sl scancel $jobs_submitted 2> /dev/null
    for _ in $(seq 100); do [ -z "$(sl squeue -h 2> /dev/null)" ] && break; sleep 0.1; done
  fi
  for p in $pids; do stop_pid "$p"; done
  # What slurmd started and outlived it (slurmstepd detaches from it), by pid.
  for p in $(cluster_pids); do kill -KILL "$p" 2> /dev/null; done
  sleep 0.2
  local left
  left=$(cluster_pids)
  if [ -n "$left" ]; then
    echo "FAIL: processes left behind: $left"
    exit 1
  fi
  echo "no processes left behind"
  rm -rf "$t"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# munge: a fresh key and our own socket.
mkdir -m 700 "$t/munge-key" && mkdir -m 755 "$t/munge"
mungekey -c -k "$t/munge-key/munge.key" > /dev/null 2>&1 || skip "mungekey could not create a key"
munged -F --socket="$t/munge/munge.socket" --key-file="$t/munge-key/munge.key" \
  --log-file="$t/munge-key/munged.log" --pid-file="$t/munge/munged.pid" --seed-file="$t/munge-key/munged.seed" \
  > "$t/munged.out" 2>&1 < /dev/null &
pids="$! $pids"
for _ in $(seq 100); do [ -S "$t/munge/munge.socket" ] && break; sleep 0.1; done
munge -n -S "$t/munge/munge.socket" 2> /dev/null | unmunge -S "$t/munge/munge.socket" > /dev/null 2>&1 ||
  skip "munged does not start here: $(tail -1 "$t/munged.out")"

# slurm.conf: this host as the only node, on two free loopback ports.
read -r ctld_port slurmd_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
cpus=$(nproc)
[ "$cpus" -gt 2 ] && cpus=2
mkdir -p "$t/ctld" "$t/spool" "$t/jobs" "$t/tmp"
cat > "$conf" << EOF
ClusterName=copsetest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$t/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$t/ctld
SlurmdSpoolDir=$t/spool
SlurmctldPidFile=$t/slurmctld.pid
SlurmdPidFile=$t/slurmd.pid
SlurmctldLogFile=$t/slurmctld.log
SlurmdLogFile=$t/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
KillWait=5
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=10 State=UP
EOF
SLURM_CONF=$conf slurmctld -D -i -f "$conf" > "$t/slurmctld.out" 2>&1 < /dev/null &
pids="$! $pids"
SLURM_CONF=$conf slurmd -D -N "$node" -f "$conf" > "$t/slurmd.out" 2>&1 < /dev/null &
pids="$! $pids"
state=
for _ in $(seq 150); do
  state=$(sl sinfo -h -n "$node" -o %T 2> /dev/null)
  [ "$state" = idle ] && break
  sleep 0.2
done
if [ "$state" != idle ]; then
  echo "slurmctld: $(tail -3 "$t/slurmctld.log" 2> /dev/null)"
  echo "slurmd: $(tail -3 "$t/slurmd.log" 2> /dev/null)"
  skip "Slurm does not start here (node $node is \"$state\")"
fi
echo "slurm: node $node idle, $cpus cpus, slurmctld on 127.0.0.1:$ctld_port"

# run_job NAME JOB_FILE: the launcher under sbatch; sets $job_state, $job_exit, $job_out.
jobs_submitted=""
run_job() {
  local name=$1 file=$2 id
  id=$(cd "$t/jobs" && sl sbatch --parsable -N 1 --cpus-per-task="$cpus" --time=5 -o "$t/jobs/$name.out" --chdir="$t/jobs" \
    --export="ALL,COPSE=$copse,COPSE_DIE_WITH_PARENT=1,COPSE_SLURM_START_TIMEOUT=60,COPSE_SLURM_TIMEOUT=90,TMPDIR=$t/tmp" \
    "$launcher" "$file" "$t/jobs/$name-output")
  [ -n "$id" ] || { echo "FAIL: sbatch refused the launcher"; exit 1; }
  jobs_submitted="$jobs_submitted $id"
  job_state=
  while [ $SECONDS -lt $deadline ]; do
    job_state=$(sl scontrol show job -o "$id" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case $job_state in PENDING | CONFIGURING | RUNNING | COMPLETING | "") sleep 0.3 ;; *) break ;; esac
  done
  job_exit=$(sl scontrol show job -o "$id" | sed -n 's/.* ExitCode=\([0-9]*\):.*/\1/p')
  job_out=$(cat "$t/jobs/$name.out" 2> /dev/null)
  echo "== slurm job $id ($name): $job_state, exit $job_exit"
  echo "$job_out"
}

fail() {
  echo "FAIL: $*"
  exit 1
}

# A job that completes: the same digest as on the embedded local cluster.
run_job diamond "$example"
[ "$job_state" = COMPLETED ] && [ "$job_exit" = 0 ] || fail "the diamond job did not complete"
echo "$job_out" | grep -q "alive .*host=$node" || fail "no daemon of node $node with label host=$node"
echo "$job_out" | grep -q '"diamond": completed' || fail "no completed status printed"
COPSE_DIE_WITH_PARENT=1 "$copse" run --daemons 1 --output "$t/reference" "$example" > /dev/null 2>&1 ||
  fail "copse run of $example failed"
cmp "$t/jobs/diamond-output/digest.txt" "$t/reference/digest.txt" || fail "the outputs differ from copse run's"
echo "diamond outputs identical to copse run's"
ls "$t/jobs/copse-slurm-"*/jm.log "$t/jobs/copse-slurm-"*/daemon-"$node".log > /dev/null || fail "no job manager or daemon log"
[ -z "$(ls -A "$t/tmp")" ] || fail "the node-local scratch directory was not removed: $(ls "$t/tmp")"

# A job that fails: the launcher exits 1 and Slurm says so.
cat > "$t/fail.json" << 'EOF'
{"stages": [{"name": "x", "program": "exec", "params": {"argv": ["no-such-binary-xyz"]}, "max_attempts": 1}]}
EOF
run_job fails "$t/fail.json"
[ "$job_state" = FAILED ] && [ "$job_exit" = 1 ] || fail "the failing job did not fail with exit status 1"
echo "$job_out" | grep -q '"job": failed' || fail "no failed status printed"

echo "PASS: copse-slurm.sbatch ran a job to completion and reported a failure through Slurm"
