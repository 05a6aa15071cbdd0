#!/bin/sh
# A training job's results (test accuracy, images/s) are in every status of it — `submit
# --wait`, `status`, `status -o json` — not only in `copse run`'s summary, and its eval vertex
# logs them (`copse logs JOB 'eval[0]'`). Needs Debian's Fashion-MNIST (skipped, 77, without).
# Usage: training_results.sh COPSE_BINARY WORK_DIR
[ -d /usr/share/datasets/fashion-mnist ] || { echo "no Fashion-MNIST here; skipped"; exit 77; }
. "$(dirname "$0")/local_cluster.sh"
start_jm
start_daemon d0 2
"$copse" graph data-parallel --workers 1 --steps 3 --limit 512 --test-limit 256 -f "$d/dp.json" || exit 1
"$copse" submit --state-dir "$d/jm" "$d/dp.json" --wait | grep -o "test accuracy [0-9.]* %"
echo "submit --wait exit=$?"
"$copse" status --state-dir "$d/jm" 1 | grep -o "test accuracy [0-9.]* %"
"$copse" status --state-dir "$d/jm" 1 -o json | grep -c '"test_accuracy"' | sed 's/^/status -o json test_accuracy: /'
"$copse" logs --state-dir "$d/jm" 1 'eval[0]' 2>/dev/null | grep -o "test accuracy [0-9.]* % on 256 images"
