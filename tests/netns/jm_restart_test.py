"""The job manager SIGKILLed, and two daemons with it that never come back: the job completes
on the daemon that is left, with the bytes `copse run` gives.

Hosts: the job manager on h0, daemons dB (1 cpu) on h1, dA (2 cpus) on h2, dC (3 cpus) on h3.
The job is p -> (memory) -> q -> (file) -> r, each a `checksum` vertex; p needs 1 cpu, q 2 and r
3, and the daemons are started one at a time, so p completes on dB, q on dA and r runs (3 s)
on dC. Then the job manager, dA and dB are SIGKILLed; the job manager is started again on its
state dir. dA and dB never come back, so q's output (needed by r) and then p's (needed by q's
new attempt) must be made again on dC. Checks: the job completes within 90 s and its output has
the fault-free digest. (Found by bench/netns_soak.py: the restarted job manager sent q's new
attempt with p's output located at dB, whose address it never learned: every daemon refused
the malformed message, was declared lost, and the job failed at max_daemon_losses; fixed in
commit d78ec7a.)
Exits 77 where namespaces cannot be made.

usage: jm_restart_test.py COPSE REPO WORKDIR"""

import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_cluster as nc  # noqa: E402

JOB = {"version": 1, "name": "three-daemons",
       "stages": [{"name": "p", "program": "checksum", "params": {"bytes": 100000}},
                  {"name": "q", "program": "checksum", "resources": {"cpus": 2}},
                  {"name": "r", "program": "checksum", "params": {"sleep_ms": 3000}, "resources": {"cpus": 3}}],
       "edges": [{"from": "p", "to": "q", "channel": "memory"}, {"from": "q", "to": "r", "channel": "file"}],
       "outputs": [{"from": "r", "path": "digest.txt"}]}


def main():
    copse, _repo, work = nc.start_test(sys.argv)
    t0 = time.monotonic()
    job_file = os.path.join(work, "job.json")
    with open(job_file, "w") as f:
        json.dump(JOB, f)
    reference = nc.comparable_digests_of_run(copse, job_file, os.path.join(work, "ref"), daemons=1, cpus=3)
    print(f"reference: {reference} ({time.monotonic() - t0:.1f} s)")
    with nc.Cluster(copse, os.path.join(work, "cluster"), hosts=4) as c:
        try:
            c.start_jm()
            c.add_daemon("dB", 1, cpus=1)
            job = c.submit(job_file)

            def logged(text):
                return lambda: any(text in line for line in c.events(job))
            nc.wait_until("p to complete on dB", logged("p[0] version 1 completed on dB"), 30)
            c.add_daemon("dA", 2, cpus=2)
            nc.wait_until("q to complete on dA", logged("q[0] version 1 completed on dA"), 30)
            c.add_daemon("dC", 3, cpus=3)
            nc.wait_until("r to run on dC", logged("r[0] version 1 placed on dC"), 30)
            for name in ("jm", "dA", "dB"):
                c.kill(name, signal.SIGKILL)
            print(f"job {job}: p done on dB, q on dA, r running on dC; SIGKILLed the job manager, dA and dB")
            c.start_jm()
            _, events = c.expect_outputs(f"job {job}", job, os.path.join(work, "out"), reference, timeout=90)
            print("events:\n  " + "\n  ".join(events))
        except BaseException:
            c.dump_logs()
            raise
    print(f"job manager restart with two daemons gone: completed with copse run's bytes in {time.monotonic() - t0:.1f} s")
    print("PASS")


if __name__ == "__main__":
    nc.skip_on_unavailable(main)
