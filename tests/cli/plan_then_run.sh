#!/bin/sh
# `copse plan` end to end: it profiles a model on a local cluster and calibrates on short
# training runs, prints the layouts it weighed, writes the fastest as a job that `copse run`
# completes with the prediction beside the measured steady step; it plans again from the saved
# cost table, refuses a daemon too small naming what is missing (the default mlp's 1.9 M
# parameters in 1 MiB), writes the profiling job alone for a cluster, names the field of a bad
# table, refuses a table measured for other flags, plans one daemon without pipelines, plans a
# gpt model, and refuses a model that does not exist up front. Each check prints "ok: …" or "FAILED: …"; the last line counts
# the failures. Needs Debian's Fashion-MNIST to run the planned job (skipped, 77, without).
# Usage: plan_then_run.sh COPSE_BINARY WORK_DIR
[ -d /usr/share/datasets/fashion-mnist ] || { echo "no Fashion-MNIST here; skipped"; exit 77; }
copse=$1 d=$2
export COPSE_DIE_WITH_PARENT=1
rm -rf "$d" && mkdir -p "$d" && cd "$d" || exit 1
failed=0
# check LABEL COMMAND…: runs COMMAND (a test) and says whether it held.
check() {
  label=$1
  shift
  if "$@"; then echo "ok: $label"; else echo "FAILED: $label"; failed=$((failed + 1)); fi
}
has() { grep -q -- "$1" "$2"; }

model=mlp:784-64-32-10
flags="--model $model --batch 64 --steps 4 --limit 512 --test-limit 256 --daemons 2 --repeats 2"
"$copse" plan $flags --out plan.json --save-costs costs.json > plan.out 2>&1
check "plan exits 0" [ $? -eq 0 ]
check "data-parallel layouts weighed" has '^[ *] data-parallel [0-9]' plan.out
check "pipeline layouts weighed" has '^[ *] pipeline 2 1f1b M=' plan.out
check "interleaved layouts weighed" has '^[ *] pipeline 2 interleaved V=2 M=' plan.out
check "calibrated" has "calibrated: layer passes x" plan.out
check "the job written" has '^wrote plan.json: ' plan.out
check "the table saved with its calibration" has '"calibration"' costs.json

"$copse" run plan.json --daemons 2 --output out -o json > run.json 2> run.err
check "the planned job runs" [ $? -eq 0 ]
check "its summary has the prediction" has '"predicted_step_ms"' run.json
check "and the measured steady step" has '"measured_step_ms"' run.json

"$copse" plan $flags --costs costs.json --out again.json -o json > again.out
check "plan --costs exits 0" [ $? -eq 0 ]
check "plan -o json lists candidates" has '"candidates"' again.out
check "plan --costs writes the same layout" cmp -s plan.json again.json

"$copse" plan --model mlp --batch 64 --repeats 1 --no-calibrate --memory-mb 1 --out small.json > small.out 2>&1
check "no layout fits: exit 1" [ $? -eq 1 ]
check "no layout fits: names the stage and the shortfall" \
  has 'no layout fits: [a-z]* [0-9]* needs [0-9.]* MiB, [0-9.]* MiB more than the 1.0 MiB a daemon offers' small.out
check "no job written when nothing fits" [ ! -e small.json ]

"$copse" plan $flags --profile-job profile.json && "$copse" validate profile.json > /dev/null
check "the profiling job alone validates" [ $? -eq 0 ]

sed 's/"optimizer_per_parameter": [0-9.e-]*/"optimizer_per_parameter": "fast"/' costs.json > bad.json
"$copse" plan $flags --costs bad.json --out bad-plan.json > bad.out 2>&1
check "a bad table: exit 1" [ $? -eq 1 ]
check "a bad table: the field named" has 'bad.json: /optimizer_per_parameter: expected a number' bad.out
sed 's/"measured": [a-z]*/"measured": "yes"/' costs.json > bad2.json
"$copse" plan $flags --costs bad2.json --out bad-plan.json > bad2.out 2>&1
check "a bad link flag: named, exit 1" has '/link/measured: expected true or false' bad2.out
"$copse" plan $flags --costs costs.json --threads 2 --out bad-plan.json > threads.out 2>&1
check "a table of other threads: refused" has 'was measured for with 1 thread(s), not --threads 2' threads.out

"$copse" plan --model $model --batch 64 --repeats 1 --daemons 1 --no-calibrate --out one.json > one.out 2>&1
check "one daemon: exit 0" [ $? -eq 0 ]
check "one daemon: no pipeline weighed" sh -c "! grep -q ' pipeline ' one.out"
check "one daemon: hop and rate said unmeasured" has '(not measured: defaults)' one.out

if [ -d /usr/share/games/fortunes ]; then  # the gpt's text (Debian package fortunes)
  "$copse" plan --model gpt:1-16-2-8 --batch 8 --steps 2 --repeats 1 --optimizer adamw --out gpt.json > gpt.out 2>&1
  check "a gpt model plans" [ $? -eq 0 ]
  check "a gpt model: tensor-parallel weighed" has '^[ *] tensor-parallel 2 ' gpt.out
  check "a gpt model: calibrated" has "calibrated: layer passes x" gpt.out
  "$copse" run gpt.json --daemons 2 --output gpt-out -o json > gpt-run.json 2> gpt-run.err
  check "the planned gpt job runs" [ $? -eq 0 ]
else
  echo "ok: no /usr/share/games/fortunes here; the gpt checks skipped"
fi
"$copse" plan --model mlp:785-10 --out bad-model.json > bad-model.out 2>&1
check "a model that does not exist: usage error" [ $? -eq 2 ]
echo "checks failed: $failed"
