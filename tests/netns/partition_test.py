"""A daemon's host partitioned from every other host for twice the heartbeat timeout, then
healed, while a job runs on it.

The job manager runs on h0 (heartbeat timeout 1 s), daemons d1, d2, d3 on h1, h2, h3. First
three jobs complete (wordcount, diamond, a small lineage job) and their declared outputs are
fetched. The daemon holding the most of those outputs is the victim. Then a lineage job with
slow vertices (6 mids of 2.5 s: every daemon runs some) is submitted and, once it runs on the
victim, the victim's host is cut off from every other host (iptables DROP of everything
arriving from the other side, both ways) for 2 s, then healed. Checks:
  - the job manager declared the victim lost during the partition (else nothing was tested),
    and the victim registered again once healed;
  - the job running during the partition completes, and its data.txt has the digest
    `copse run` gives it without faults;
  - no superseded attempt's output was read: its lineage.txt (which attempt of each input every
    attempt upstream of the sink read, written by the vertices themselves) names only attempts
    the job manager's event log records as completed, none read after a newer attempt of the
    same vertex had completed before the reader was placed, and the outputs are the sink's
    last completed attempt's (netns_cluster.check_lineage);
  - every job completed before the partition still has all its declared outputs: `copse status
    JOB --output` copies exactly the same bytes as before.
Exits 77 where namespaces cannot be made.

usage: partition_test.py COPSE REPO WORKDIR"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_cluster as nc  # noqa: E402

HEARTBEAT_MS = 1000
OUTPUT_VERTEX = {"wordcount": "merge[0]", "diamond": "sink", "lineage_small": "sink"}


def main():
    copse, repo, work = nc.start_test(sys.argv)
    t0 = time.monotonic()
    examples = os.path.join(repo, "examples")
    before_jobs = {
        "wordcount": os.path.join(examples, "wordcount", "wordcount.json"),
        "diamond": os.path.join(examples, "diamond.json"),
        "lineage_small": nc.lineage_job(os.path.join(work, "lineage_small.json"), name="lineage-small", pad_bytes=4096),
    }
    running_job = nc.lineage_job(os.path.join(work, "lineage_slow.json"), name="lineage-slow", sources=3, mids=6,
                                 aggs=2, pad_bytes=64 << 10, sleep_ms=(200, 2500, 300, 0))
    reference = nc.comparable_digests_of_run(copse, running_job, os.path.join(work, "ref-slow"))
    print(f"reference of the job to partition: {reference} ({time.monotonic() - t0:.1f} s)")

    with nc.Cluster(copse, os.path.join(work, "cluster"), hosts=4, heartbeat_timeout_ms=HEARTBEAT_MS) as c:
        try:
            c.start_jm()
            for i in (1, 2, 3):
                c.add_daemon(f"d{i}", i, cpus=2, wait=False)
            c.wait_daemons()

            # ---- jobs completed before the partition ----
            before = {}
            holders = {}
            for name, path in before_jobs.items():
                job = c.submit(path)
                s = c.wait_job(job, timeout=60)
                if s["state"] != "completed":
                    raise nc.Failure(f"{name} (job {job}) ended {s['state']} before any fault: {s.get('failure')}")
                out = os.path.join(work, f"before-{name}")
                p = c.fetch_outputs(job, out)
                if p.returncode != 0:
                    raise nc.Failure(f"status --output of {name} before the partition: {p.stderr.strip()}")
                before[name] = (job, nc.digests(out))
                vertex = nc._canonical(OUTPUT_VERTEX[name])
                for line in c.events(job):
                    m = nc.EVENT_RE.match(line)
                    if m and m.group(4) == "completed on" and nc._canonical(m.group(2)) == vertex:
                        holders[m.group(5)] = holders.get(m.group(5), 0) + 1
                print(f"before: {name} (job {job}) completed, outputs {before[name][1]}")
            victim = max(sorted(c.daemons()), key=lambda d: holders.get(d, 0))
            vhost = c.procs[victim].host
            print(f"declared outputs per daemon: {holders}; the victim is {victim} on {vhost}")

            # ---- the job running during the partition ----
            job = c.submit(running_job)
            nc.wait_until(f"job {job} to run on {victim}",
                          lambda: any(f"placed on {victim}" in line for line in c.events(job)), 30, 0.1)
            time.sleep(0.5)  # its attempts there are under way
            print(f"job {job} runs on {victim}; isolating {vhost} for {2 * HEARTBEAT_MS} ms")
            cut = time.monotonic()
            c.net.isolate(vhost)
            seen_lost = False
            while time.monotonic() - cut < 2 * HEARTBEAT_MS / 1000:
                rows = c.daemon_rows() or []
                if any(r["name"] == victim and not r.get("superseded") and r["state"] != "alive" for r in rows):
                    seen_lost = True
                time.sleep(0.1)
            c.net.heal()
            print(f"healed after {time.monotonic() - cut:.2f} s; the job manager saw {victim} "
                  f"{'lost' if seen_lost else 'alive throughout'}")
            if not seen_lost:
                raise nc.Failure(f"{victim} cut off for {2 * HEARTBEAT_MS} ms was never declared lost by the job manager "
                                 f"(heartbeat timeout {HEARTBEAT_MS} ms)")
            c.wait_daemons([victim], timeout=30)
            print(f"{victim} registered again")

            s, events = c.expect_outputs("the job run during the partition", job, os.path.join(work, "out-slow"), reference,
                                         timeout=90, lineage=True)
            print("events of the job run during the partition:\n  " + "\n  ".join(events))
            reruns = sorted({line.split()[1] for line in events if nc.EVENT_RE.match(line) and " version 1 " not in line})
            print(f"job {job}: completed with the fault-free digest; lineage consistent with the event log; "
                  f"vertices run again: {reruns}")

            # ---- the jobs completed before: same bytes ----
            for name, (bjob, want) in before.items():
                out = os.path.join(work, f"after-{name}")
                p = c.fetch_outputs(bjob, out)
                if p.returncode != 0:
                    raise nc.Failure(f"{name} (job {bjob}), completed before the partition, lost its outputs: "
                                     f"{p.stderr.strip()}")
                got = nc.digests(out)
                if got != want:
                    raise nc.Failure(f"{name} (job {bjob}): outputs changed:\n  before {want}\n  after  {got}")
                print(f"after: {name} (job {bjob}) outputs fetched again, same bytes")
        except BaseException:
            c.dump_logs()
            raise
    print(f"partition: every check passed in {time.monotonic() - t0:.1f} s")
    print("PASS")


if __name__ == "__main__":
    nc.skip_on_unavailable(main)
