"""/metrics of the job manager and of the daemons, scraped while a real job runs and after it,
read by an independent parser (Python's prometheus_client): the counters agree with the job's
own summary, and the daemons' counts with the job manager's.

usage: metrics_test.py COPSE REPO   (exit 77: skipped, with the reason)"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from cluster import Cluster, training_job  # noqa: E402

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("skipped: python3-prometheus-client is not installed")
    sys.exit(77)

copse, repo = sys.argv[1:3]


def scrape(cluster, address=None):
    status, text = cluster.request("/metrics", raw=True, address=address)
    assert status == 200, (status, text)
    samples = {}
    for family in text_string_to_metric_families(text):  # raises on anything malformed
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples, name):
    return sum(v for (n, _), v in samples.items() if n == name)


with Cluster(copse, daemons=2, cpus=2, daemon_metrics=True, extra_jm_flags=("--straggler-factor", "0")) as cluster:
    # A viewer's token reads metrics; nothing else does.
    status, _ = cluster.request("/metrics", token="", raw=True)
    assert status == 401, status
    job_file = training_job(repo)
    job_file["faults"] = [{"fail": "fwd0[3]", "attempts": [1]}, {"fail": "bwd1[7]", "attempts": [1, 2]}]
    job = cluster.submit(job_file)

    # While it runs: every vertex of the running job is in exactly one state.
    mid_run = 0
    while cluster.get(f"/api/v1/jobs/{job}")["state"] == "running":
        m = scrape(cluster)
        if value(m, "copse_jobs", state="running") == 1:
            assert total(m, "copse_vertices") == 1703, total(m, "copse_vertices")
            mid_run += 1
        time.sleep(0.05)
    assert mid_run > 0, "no scrape landed while the job ran"

    summary = cluster.wait_job(job)
    assert summary["state"] == "completed", summary
    m = scrape(cluster)
    assert value(m, "copse_jobs_submitted_total") == 1
    assert value(m, "copse_jobs_finished_total", state="completed") == 1
    assert value(m, "copse_jobs", state="completed") == 1
    assert value(m, "copse_input_bytes_total", locality="local") == summary["input_bytes"]["local"]
    assert value(m, "copse_input_bytes_total", locality="remote") == summary["input_bytes"]["remote"]
    by_reason = {}
    for r in summary["recoveries"]:
        by_reason[r["reason"]] = by_reason.get(r["reason"], 0) + 1
    for reason, n in by_reason.items():
        assert value(m, "copse_recoveries_total", reason=reason) == n, (reason, n, m)
    assert total(m, "copse_recoveries_total") == len(summary["recoveries"]) == 3
    failed = total(m, "copse_attempts_failed_total")
    assert failed == 3, failed  # fwd0[3] once, bwd1[7] twice
    completed = value(m, "copse_attempts_completed_total")
    assert completed == 1703, completed  # no re-runs of completed vertices in this job
    # Tasks sent ahead after an attempt that then failed are withdrawn and sent again.
    assert value(m, "copse_attempts_dispatched_total") >= completed + failed, value(m, "copse_attempts_dispatched_total")
    assert value(m, "copse_scheduling_latency_seconds_count") > 0
    assert value(m, "copse_daemons", state="alive") == 2 and value(m, "copse_capacity_cpus") == 4
    assert value(m, "copse_journal_commit_seconds_count") > 0

    # The daemons ran what the job manager counted.
    succeeded = failed_on_daemons = 0
    for name in ("d0", "d1"):
        d = scrape(cluster, cluster.daemon_metrics_address(name))
        succeeded += value(d, "copse_daemon_attempts_total", outcome="succeeded")
        failed_on_daemons += total(d, "copse_daemon_attempts_total") - value(d, "copse_daemon_attempts_total", outcome="succeeded")
        assert value(d, "copse_daemon_slots") == 2
        assert 0 < value(d, "copse_daemon_utilisation") <= 1
        assert value(d, "copse_daemon_attempt_seconds_count") == total(d, "copse_daemon_attempts_total")
    assert succeeded == completed, (succeeded, completed)
    assert failed_on_daemons == failed, (failed_on_daemons, failed)
    print(f"metrics agree: {int(completed)} attempts completed, {int(failed)} failed, {mid_run} scrapes mid-run")
