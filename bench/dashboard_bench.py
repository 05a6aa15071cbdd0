"""What the dashboard costs and how fast it draws (issue: HTTP API and dashboard).

  /usr/bin/python3 bench/dashboard_bench.py <build>/cli/copse [--runs R]

On one job manager (--http) and 2 daemons x 2 slots on 127.0.0.1, prints:
 * throughput of a 50,000-vertex noop DAG (100 layers x 500, 2 inputs each; cluster_bench's
   shape, 5x wider so that a run lasts long enough for a dashboard to load and poll), in
   interleaved triples: with nothing watching; with headless Chromium showing that job's page
   (the browser shares the 2 cores); and with the page's requests alone (its event stream, and
   the timeline and a page of vertices each second, from a thread of this script: what the job
   manager sees of a browser on another machine). Medians, ratios, and the job manager's CPU
   seconds per run;
 * the dashboard's first render of a running 100,000-vertex job (10 stages x 10,000, all done
   but one vertex held by a delay): from navigation to the graph, the newest 5000 spans of the
   timeline and the first page of vertices drawn; median of R fresh page loads, and the job
   manager's time for the status and timeline requests behind it.
Needs Debian's chromium, chromium-driver and python3-selenium."""

import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "http"))
from cluster import Cluster  # noqa: E402

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

copse = sys.argv[1]
runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 5


def noop_dag(layers, width):
    job = {"name": f"noop-{layers}x{width}", "stages": [], "edges": []}
    for layer in range(layers):
        job["stages"].append({"name": f"L{layer}", "program": "noop", "replicas": width})
        if layer:
            for i in range(width):
                for k in (i, (i + 1) % width):
                    job["edges"].append({"from": f"L{layer - 1}[{k}]", "to": f"L{layer}[{i}]"})
    return job


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1600", f"--user-data-dir={tempfile.mkdtemp()}"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def wait_for(check, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.005)
    raise TimeoutError("timed out")


def cpu_seconds(pids):
    """User + system CPU seconds the processes `pids` have used (/proc/PID/stat)."""
    total = 0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def browser_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and "chrom" in open(f"/proc/{p}/comm").read()]


class Watcher:
    """The dashboard's requests on a job's page, without a browser: the event stream, and the
    timeline (newest 5000 spans) and 50 vertices each second, as dashboard.js asks for them."""

    def __init__(self, cluster, job_id):
        self.cluster, self.job_id, self.stop = cluster, job_id, threading.Event()
        self.threads = [threading.Thread(target=self.poll), threading.Thread(target=self.stream)]
        for t in self.threads:
            t.start()

    def poll(self):
        while not self.stop.wait(1.0):
            self.cluster.request(f"/api/v1/jobs/{self.job_id}/timeline?limit=5000", raw=True)
            self.cluster.request(f"/api/v1/jobs/{self.job_id}/vertices?offset=0&limit=50", raw=True)

    def stream(self):
        import http.client
        host, port = self.cluster.http.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.request("GET", f"/api/v1/events?job={self.job_id}", headers={"Authorization": "Bearer " + self.cluster.secret})
        res = conn.getresponse()
        while not self.stop.is_set():
            if not res.fp.readline():
                break
        conn.close()

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def run_job(cluster, job):
    """(seconds the job manager took from submit to completed, its id, job manager CPU seconds,
    browser CPU seconds) of one run."""
    jm = [cluster.procs["jm"].pid]
    jm_cpu, browser_cpu = cpu_seconds(jm), cpu_seconds(browser_pids())
    job_id = cluster.submit(job)
    while True:  # the jobs table: what this poll costs the job manager does not grow with the job
        status = next(j for j in cluster.get("/api/v1/jobs")["jobs"] if j["id"] == job_id)
        if status["state"] != "running":
            break
        time.sleep(0.05)
    assert status["state"] == "completed", status
    return status["elapsed_s"], job_id, cpu_seconds(jm) - jm_cpu, cpu_seconds(browser_pids()) - browser_cpu


with Cluster(copse, daemons=2, cpus=2, extra_jm_flags=("--straggler-factor", "0")) as cluster:
    driver = browser()
    try:
        import subprocess
        driver.get(subprocess.run([copse, "dashboard", "--admin", "--state-dir", cluster.state], capture_output=True,
                                  text=True, check=True).stdout.strip())
        dag = noop_dag(100, 500)
        run_job(cluster, dag)  # warm-up
        closed, opened, replayed, jm_closed, jm_opened, jm_replayed, browser_cpu = [], [], [], [], [], [], []
        next_id = len(cluster.get("/api/v1/jobs")["jobs"]) + 1
        print(f"dashboard_bench: job manager + 2 daemons x 2 slots on 127.0.0.1, {runs} interleaved triples")
        for r in range(runs):
            driver.get(f"http://{cluster.http}/#/")  # the jobs list only: no job page polling
            secs, _, jm_cpu, _ = run_job(cluster, dag)
            closed.append(secs)
            jm_closed.append(jm_cpu)
            next_id += 1
            # The next job's page, open before it is submitted: it draws the job as it runs.
            driver.get(f"http://{cluster.http}/#/jobs/{next_id}")
            secs, job_id, jm_cpu, b_cpu = run_job(cluster, dag)
            assert job_id == next_id, (job_id, next_id)
            wait_for(lambda: driver.find_element(By.ID, "job-view").get_attribute("data-state") == "completed", 30)
            opened.append(secs)
            jm_opened.append(jm_cpu)
            browser_cpu.append(b_cpu)
            next_id += 1
            driver.get(f"http://{cluster.http}/#/")
            watcher = Watcher(cluster, next_id)
            secs_r, job_id, jm_cpu_r, _ = run_job(cluster, dag)
            watcher.close()
            assert job_id == next_id, (job_id, next_id)
            replayed.append(secs_r)
            jm_replayed.append(jm_cpu_r)
            next_id += 1
            print(f"  triple {r + 1}: closed {50000 / closed[-1]:,.0f} vertices/s (job manager CPU {jm_closed[-1]:.2f} s), "
                  f"dashboard open {50000 / secs:,.0f} vertices/s (job manager CPU {jm_cpu:.2f} s, browser CPU {b_cpu:.2f} s), "
                  f"its requests alone {50000 / secs_r:,.0f} vertices/s (job manager CPU {jm_cpu_r:.2f} s)")
        c, o, w = statistics.median(closed), statistics.median(opened), statistics.median(replayed)
        print(f"  50,000-vertex noop DAG, medians: nothing watching {50000 / c:,.0f} vertices/s; the job's dashboard open in "
              f"Chromium on the same 2 cores {50000 / o:,.0f} vertices/s ({c / o:.3f} of it; the browser used "
              f"{statistics.median(browser_cpu):.2f} CPU s per run); the dashboard's requests alone {50000 / w:,.0f} vertices/s "
              f"({c / w:.3f} of it; target >= 0.98). Job manager CPU per run: {statistics.median(jm_closed):.2f} s, "
              f"{statistics.median(jm_opened):.2f} s, {statistics.median(jm_replayed):.2f} s")

        # A 100,000-vertex job held running by one delayed vertex.
        big = {"name": "big", "stages": [{"name": f"s{i}", "program": "noop", "replicas": 10000} for i in range(10)],
               "edges": [{"from": f"s{i}", "to": f"s{i + 1}"} for i in range(9)],
               "faults": [{"delay": "s9[9999]", "ms": 600000}]}
        big_id = cluster.submit(big)
        wait_for(lambda: cluster.get(f"/api/v1/jobs/{big_id}")["vertices"]["completed"] >= 99999, 120)
        renders = []
        for r in range(runs):
            driver.get("about:blank")
            t0 = time.perf_counter()
            driver.get(f"http://{cluster.http}/#/jobs/{big_id}")
            wait_for(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#dag g.stage")) == 10 and
                     driver.find_element(By.ID, "timeline").get_attribute("data-spans") == "5000" and
                     len(driver.find_elements(By.CSS_SELECTOR, "#vertices tbody tr")) == 50)
            renders.append(time.perf_counter() - t0)
        server = {}
        for path in (f"/api/v1/jobs/{big_id}", f"/api/v1/jobs/{big_id}/timeline?limit=5000",
                     f"/api/v1/jobs/{big_id}/vertices?limit=50"):
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                cluster.request(path, raw=True)
                times.append(time.perf_counter() - t0)
            server[path.split("/")[-1].split("?")[0]] = statistics.median(times) * 1000
        print(f"  first render of a running 100,000-vertex job (graph, 5000 timeline spans, 50 vertices): median "
              f"{statistics.median(renders):.2f} s of {runs} page loads (target <= 2 s); requests behind it: status "
              f"{server[str(big_id)]:.1f} ms, timeline {server['timeline']:.1f} ms, vertices {server['vertices']:.1f} ms")
        cluster.request(f"/api/v1/jobs/{big_id}/cancel", method="POST", body={})
    finally:
        driver.quit()
