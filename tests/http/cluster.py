"""A real copse cluster for the HTTP tests: a job manager serving --http and daemons, each a
process this module started and ends by its id (SIGKILL after a grace), in a temporary state
directory. Only loopback addresses. Python's standard library only."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request


class Cluster:
    def __init__(self, copse, daemons=2, cpus=2, heartbeat_ms=1000, extra_jm_flags=(), daemon_metrics=False):
        self.copse = copse
        self.dir = tempfile.mkdtemp(prefix="copse-http-")
        self.state = os.path.join(self.dir, "jm")
        self.procs = {}
        self.logs = []
        self.daemon_metrics = daemon_metrics
        try:
            self._start("jm", [copse, "jm", "--listen", "127.0.0.1:0", "--state-dir", self.state, "--http", "127.0.0.1:0",
                               "--heartbeat-timeout-ms", str(heartbeat_ms), *extra_jm_flags])
            self.http = self._wait_file(os.path.join(self.state, "http.addr"))
            self.secret = open(os.path.join(self.state, "secret")).read().strip()
            for i in range(daemons):
                self.add_daemon(f"d{i}", cpus)
            self.wait_daemons(daemons)
        except BaseException:
            self.stop()
            raise

    def _start(self, name, argv):
        log = open(os.path.join(self.dir, name + ".log"), "w")
        self.logs.append(log)
        # Ended with this test even when it is killed (a CTest timeout): they die with their parent.
        env = dict(os.environ, COPSE_DIE_WITH_PARENT="1")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)

    def _wait_file(self, path, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(path):
                text = open(path).read().strip()
                if text:
                    return text
            time.sleep(0.05)
        raise TimeoutError(f"{path} did not appear; job manager log:\n{self.log('jm')}")

    def restart_jm(self):
        """Stops the job manager (SIGTERM, waited for) and starts it again on its state directory;
        its HTTP API comes back on a new port."""
        jm = self.procs["jm"]
        os.killpg(jm.pid, signal.SIGTERM)
        jm.wait(timeout=10)
        os.remove(os.path.join(self.state, "http.addr"))
        self._start("jm", jm.args)
        self.http = self._wait_file(os.path.join(self.state, "http.addr"))

    def add_daemon(self, name, cpus=2):
        metrics = ["--metrics", "127.0.0.1:0"] if self.daemon_metrics else []
        self._start(name, [self.copse, "daemon", "--state-dir", self.state, "--name", name, "--cpus", str(cpus),
                           "--work-dir", os.path.join(self.dir, name), "--label", f"host={name}", *metrics])

    def daemon_metrics_address(self, name):
        return self._wait_file(os.path.join(self.dir, name, "metrics.addr"))

    def wait_daemons(self, n, timeout=20):
        deadline = time.time() + timeout
        while time.time() < deadline:
            alive = [d for d in self.get("/api/v1/daemons")["daemons"] if d["alive"]]
            if len(alive) >= n:
                return
            time.sleep(0.1)
        raise TimeoutError(f"{n} daemons did not register")

    def log(self, name):
        try:
            return open(os.path.join(self.dir, name + ".log")).read()[-4000:]
        except OSError:
            return ""

    # ---- HTTP ---------------------------------------------------------------------------------
    def request(self, path, method="GET", body=None, token=None, raw=False, address=None):
        """(status, parsed JSON or text). `token`: the bearer credential (default: the secret; "" for none);
        `address`: another server than the job manager's HTTP API (a daemon's metrics)."""
        token = self.secret if token is None else token
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = "Bearer " + token
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{address or self.http}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as res:
                status, text = res.status, res.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        if raw:
            return status, text
        return status, json.loads(text) if text else None

    def get(self, path, **kw):
        status, body = self.request(path, **kw)
        assert status == 200, f"GET {path}: {status} {body}"
        return body

    def submit(self, job, name="job.json"):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump(job, f)
        out = subprocess.run([self.copse, "submit", "--state-dir", self.state, "-o", "json", path], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["id"]

    def wait_job(self, job, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            st = self.get(f"/api/v1/jobs/{job}")
            if st["state"] != "running":
                return st
            time.sleep(0.2)
        raise TimeoutError(f"job {job} still running after {timeout} s")

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 5
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in self.logs:
            log.close()
        if not os.environ.get("COPSE_KEEP_TEST_DIRS"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def training_job(repo, kill_after=None, steps=None):
    """The main example (a 2-stage 1F1B MLP pipeline), with a daemon kill after `kill_after`
    completions when given."""
    job = json.load(open(os.path.join(repo, "examples/ml/mlp-pipeline2-1f1b-m8.json")))
    if kill_after is not None:
        job["faults"] = [{"kill_daemon_of": "fwd1[40]", "when": {"completed": kill_after}}]
    return job
