#!/bin/sh
# `copse plan` end to end: it profiles a model on a local cluster, prints the layouts it weighed,
# writes the fastest as a job that `copse run` completes with the prediction beside the
# measurement; it plans again from the saved cost table, refuses a daemon too small naming what
# is missing (the default mlp's 1.9 M parameters in 1 MiB), writes the profiling job alone for a cluster, and names the field of a bad table.
# Needs Debian's Fashion-MNIST to run the planned job (skipped, 77, without).
# Usage: plan_then_run.sh COPSE_BINARY WORK_DIR
[ -d /usr/share/datasets/fashion-mnist ] || { echo "no Fashion-MNIST here; skipped"; exit 77; }
copse=$1 d=$2
export COPSE_DIE_WITH_PARENT=1
rm -rf "$d" && mkdir -p "$d" && cd "$d" || exit 1
model=mlp:784-64-32-10
flags="--model $model --batch 64 --steps 4 --limit 512 --test-limit 256 --daemons 2 --repeats 2"
"$copse" plan $flags --out plan.json --save-costs costs.json > plan.out 2>&1
echo "plan exit=$?"
grep -c '^[ *] \(data-parallel\|pipeline\) ' plan.out | sed 's/^/layouts weighed: /'
grep -o '^wrote plan.json: .*' plan.out
"$copse" run plan.json --daemons 2 --output out -o json > run.json 2> run.err
echo "run exit=$?"
grep -c '"predicted_images_per_s"' run.json | sed 's/^/summary predictions: /'
grep -c '"measured_images_per_s"' run.json | sed 's/^/summary measurements: /'
"$copse" plan $flags --costs costs.json --out again.json -o json > again.json.out
echo "plan --costs exit=$?"
grep -c '"candidates"' again.json.out | sed 's/^/json candidates: /'
"$copse" plan --model mlp --batch 64 --repeats 1 --memory-mb 1 --out small.json 2>&1 | grep -o 'no layout fits: [a-z]* [0-9]* needs [0-9.]* MiB, [0-9.]* MiB more than the 1.0 MiB a daemon offers'
"$copse" plan $flags --profile-job profile.json && "$copse" validate profile.json > /dev/null
echo "profile job valid exit=$?"
sed 's/"optimizer_per_parameter": [0-9.e-]*/"optimizer_per_parameter": "fast"/' costs.json > bad.json
"$copse" plan $flags --costs bad.json --out bad-plan.json
echo "bad table exit=$?"
