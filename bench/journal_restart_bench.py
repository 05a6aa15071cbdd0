"""How long a job manager takes to start again, and how large its journal is, after many jobs
and after a huge one (issue: bounded state).

  /usr/bin/python3 bench/journal_restart_bench.py <build>/cli/copse [--jobs N] [--vertices V]

On a job manager and 2 daemons x 2 slots on 127.0.0.1: runs N diamond jobs (7 vertices each,
default 1000), SIGKILLs the job manager and starts it again on its state directory, timing the
start from exec to its address file (the journal's replay, the restore and the compaction at
start, and the history read back); then the same after one V-vertex job (10 stages of V/10
noop replicas, pointwise; default 1,000,000). Prints the journal's size before each restart
and the restart time (median of 3 restarts)."""

import json
import os
import signal
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "http"))
from cluster import Cluster  # noqa: E402

copse = sys.argv[1]
jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 1000
vertices = int(sys.argv[sys.argv.index("--vertices") + 1]) if "--vertices" in sys.argv else 1_000_000
repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def restart_seconds(cluster):
    """Seconds from exec to the restarted job manager's address file, median of 3 SIGKILL restarts."""
    times = []
    for _ in range(3):
        jm = cluster.procs["jm"]
        os.killpg(jm.pid, signal.SIGKILL)
        jm.wait()
        for name in ("jm.addr", "http.addr"):
            try:
                os.remove(os.path.join(cluster.state, name))
            except FileNotFoundError:
                pass
        t0 = time.perf_counter()
        cluster._start("jm", jm.args)
        cluster.http = cluster._wait_file(os.path.join(cluster.state, "http.addr"), timeout=600)
        cluster._wait_file(os.path.join(cluster.state, "jm.addr"))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def journal_mb(cluster):
    return os.path.getsize(os.path.join(cluster.state, "journal.bin")) / 1e6


print(f"journal_restart_bench: job manager + 2 daemons x 2 slots on 127.0.0.1")
with Cluster(copse, daemons=2, cpus=2) as cluster:
    diamond = json.load(open(os.path.join(repo, "examples", "diamond.json")))
    path = os.path.join(cluster.dir, "diamond.json")
    json.dump(diamond, open(path, "w"))
    import subprocess
    t0 = time.perf_counter()
    last = None
    for _ in range(jobs):
        out = subprocess.run([copse, "submit", "--state-dir", cluster.state, "-o", "json", path], capture_output=True,
                             text=True, check=True)
        last = json.loads(out.stdout)["id"]
    cluster.wait_job(last, timeout=600)
    print(f"  {jobs} diamond jobs ({jobs * 7:,} vertices) in {time.perf_counter() - t0:.1f} s; journal {journal_mb(cluster):.2f} MB")
    print(f"  restart after them: median {restart_seconds(cluster):.2f} s (target <= 1 s); journal after the restarts "
          f"{journal_mb(cluster):.2f} MB")

with Cluster(copse, daemons=2, cpus=2) as cluster:
    width = vertices // 10
    big = {"name": "big", "stages": [{"name": f"s{i}", "program": "noop", "replicas": width} for i in range(10)],
           "edges": [{"from": f"s{i}", "to": f"s{i + 1}"} for i in range(9)]}
    t0 = time.perf_counter()
    job = cluster.submit(big)
    status = cluster.wait_job(job, timeout=1200)
    assert status["state"] == "completed", status
    print(f"  one {vertices:,}-vertex job in {time.perf_counter() - t0:.1f} s; journal {journal_mb(cluster):.2f} MB")
    print(f"  restart after it: median {restart_seconds(cluster):.2f} s (target <= 1 s); journal after the restarts "
          f"{journal_mb(cluster):.2f} MB")
